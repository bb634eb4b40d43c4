//go:build tools

// Package tools pins the JobSet controller build.sh compiles (the module's root package
// is its manager command).
package tools

import (
	_ "sigs.k8s.io/jobset"
)
