"""The groupcoord coordinator server."""
