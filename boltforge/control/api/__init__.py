"""The HTTP API: FastAPI routers for jobs, agents, nodes and administration."""
