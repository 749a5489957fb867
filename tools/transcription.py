"""Metadata for goldens whose reference is code re-typed from an upstream project (not imported from an
installed package): the golden says so, names the upstream file and commit, and carries a SHA-256 of the
transcription's own source text, computed here with `inspect` from the functions the generator runs. A
later edit of the transcription changes the hash, so a golden always shows which transcription made it.
"""
import hashlib
import inspect


def transcription_sha256(*objs):
    """SHA-256 (hex) of the source text of the given functions/classes, in order, joined by newlines."""
    text = "\n".join(inspect.getsource(o) for o in objs)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def transcription_metadata(upstream, *objs):
    """{"reference_kind", "upstream", "transcription_functions", "transcription_sha256"} for a golden's metadata.

    upstream: "owner/repo@commit path[, path...]" as cited in the generator's docstring."""
    return {
        "reference_kind": "transcribed: upstream code re-typed into this generator, not imported",
        "upstream": upstream,
        "transcription_functions": ",".join(o.__qualname__ for o in objs),
        "transcription_sha256": transcription_sha256(*objs),
    }
