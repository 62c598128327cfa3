"""The errors every verbs call raises: `VerbsError` (the errno a C call would set, and why), `PostError`."""

from __future__ import annotations

import errno

from openmrc.transport import LocalProtocolError, RecvWR, SendWR


class VerbsError(LocalProtocolError):
    """A verbs call failed: ``errno`` (and ``errno_name``) as the C call would set it, ``reason`` in words."""

    def __init__(self, err: int, reason: str) -> None:
        # set here rather than by LocalProtocolError's __init__, which the compiled build checks for
        # its exact class
        self.errno = err
        self.reason = reason
        ValueError.__init__(self, f"[{errno.errorcode.get(err, err)}] {reason}")

    @property
    def errno_name(self) -> str:
        if self.errno == errno.EOPNOTSUPP:  # the same number as ENOTSUP on Linux; verbs says EOPNOTSUPP
            return "EOPNOTSUPP"
        return errno.errorcode.get(self.errno, str(self.errno))


class PostError(VerbsError):
    """`post_send` / `post_recv` stopped at ``bad_wr`` (index ``index`` of the list); the work requests
    before it are posted, it and those after it are not (``bad_wr`` of ibv_post_send)."""

    def __init__(self, err: int, reason: str, bad_wr: SendWR | RecvWR, index: int) -> None:
        super().__init__(err, reason)
        self.bad_wr = bad_wr
        self.index = index


def _err(exc: LocalProtocolError) -> VerbsError:
    return exc if isinstance(exc, VerbsError) else VerbsError(exc.errno, exc.reason)
