"""The runtime: `open_runtime` composes the store and the actors in one nursery and yields the
`Runtime` handle, the public trusted host API."""

from ..store import as_store as as_store
from ._base import DEFAULT_LEASE_MS as DEFAULT_LEASE_MS
from ._checks import findings as findings
from ._open import DEFAULT_RESYNC_MS as DEFAULT_RESYNC_MS
from ._open import StoreLike as StoreLike
from ._open import open_runtime as open_runtime
from ._passes import PollReport as PollReport
from ._reads import WorkHistory as WorkHistory
from ._runtime import ACTORS as ACTORS
from ._runtime import MAX_BATCH as MAX_BATCH
from ._runtime import Runtime as Runtime
from ._watch import Watch as Watch
