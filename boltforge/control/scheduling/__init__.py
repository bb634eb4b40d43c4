"""The scheduling loop: the world a pass reads, and how decisions become intent."""
