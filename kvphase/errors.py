"""The library's error types. Only the CLI turns them into messages and exit codes."""

import errno

_NO_MAPPING = ("failed to map segment", "cannot allocate memory")  # the loader's words when a library finds no room


class KvphaseError(Exception):
    """Base class: a problem the user can fix, described in one line."""


class ModelFileError(KvphaseError):
    """The model file is missing, unreadable, not GGUF, or truncated."""


class GGUFError(ModelFileError):
    """The file is not a well-formed GGUF, or declares values llama.cpp would refuse or abort on;
    the message names the offset or key and what was expected there."""


class PlanError(KvphaseError):
    """The requested run cannot be built: impossible length, stride, sample size..."""


class RecordLayoutError(PlanError):
    """Prefix padding cannot lay this tokenizer's records back to back at the planned positions
    (in-sequence padding, with filler between records, may)."""


class BackendError(KvphaseError):
    """The inference engine refused or failed a request."""


class RunFolderError(KvphaseError):
    """A run folder is missing files or holds a different run."""


class Interrupted(KeyboardInterrupt):
    """A signal stopped a long job after it saved what it had. The CLI prints the message and
    exits with 128 + the signal's number, as a shell does for a process the signal killed."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` says memory ran out: a MemoryError, or an import or system call that found
    no room (a shared library the dynamic loader could not map under `ulimit -v`). Here, with
    nothing imported, so that the command line can ask it while its own imports fail."""
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return True
    return isinstance(exc, (ImportError, OSError)) and any(words in str(exc).lower() for words in _NO_MAPPING)
