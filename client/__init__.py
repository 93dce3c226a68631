"""groupcoord client library: a group member and the assignors."""
