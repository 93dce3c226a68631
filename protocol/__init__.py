"""The wire contract shared by the coordinator and the client (docs/protocol.md: v1,
"v1.1 additions" and "Additions of this release"; v1.2 is not implemented yet).

``errors``: the protocol's error codes; ``limits``: the bounds every message is
validated against; ``codec``: msgpack encoding; ``messages``: one frozen
dataclass per request and response, each validated on decode;
``resources``: the embedded ``"resources"`` protocol's metadata and assignment
maps.
"""

from protocol.codec import DecodeError, decode, encode
from protocol.errors import ErrorCode
from protocol.messages import ValidationError

__all__ = ["DecodeError", "ErrorCode", "ValidationError", "decode", "encode"]
