"""loom: a durable coordination runtime on trio."""

from ._clock import Clock as Clock
from ._clock import ManualClock as ManualClock
from ._clock import OffsetClock as OffsetClock
from ._clock import SystemClock as SystemClock
from ._config import CausalLimits as CausalLimits
from ._config import Config as Config
from ._errors import CausalRefused as CausalRefused
from ._errors import ConfigError as ConfigError
from ._errors import Conflict as Conflict
from ._errors import InvalidRequest as InvalidRequest
from ._errors import LoomError as LoomError
from ._errors import NotAccepting as NotAccepting
from ._errors import NotAdoptable as NotAdoptable
from ._errors import NotFound as NotFound
from ._errors import SchemaTooNew as SchemaTooNew
from ._errors import StaleAuthority as StaleAuthority
from ._errors import StorageClosed as StorageClosed
from ._errors import StorageError as StorageError
from ._records import CausalRejection as CausalRejection
from ._records import Event as Event
from ._records import EventIn as EventIn
from ._records import KVEntry as KVEntry
from ._records import RejectionReason as RejectionReason
from ._runtime import Runtime as Runtime
from ._runtime import open_runtime as open_runtime
from .plugins import hookimpl as hookimpl
from .store import SQLiteStore as SQLiteStore

__version__ = "0.1.0"
