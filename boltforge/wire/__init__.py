"""What crosses the network: the HTTP API's request and reply bodies, shared by every side."""
