"""The store: schema, migrations, `Tx` (the only place SQL lives) and the storage actor."""

from ._actor import StorageActor as StorageActor
from ._batch import CrashPoint as CrashPoint
from ._batch import FaultHook as FaultHook
from ._dialect import Dialect as Dialect
from ._dialect import Store as Store
from ._feed import NoticeFeed as NoticeFeed
from ._open import as_store as as_store
from ._open import check_location as check_location
from ._open import default_owner as default_owner
from ._open import open_reader as open_reader
from ._reader import ActorReader as ActorReader
from ._reader import Reader as Reader
from ._schema import SCHEMA_VERSION as SCHEMA_VERSION
from ._sqlite import SQLiteStore as SQLiteStore
from ._sqlite import not_a_loom_database as not_a_loom_database
from ._tx import Tx as Tx
from ._tx_admission import AdmissionFacts as AdmissionFacts
from ._tx_admission import QueuePlace as QueuePlace
from ._tx_compaction import TABLES as TABLES
from ._tx_compaction import AttemptRow as AttemptRow
from ._tx_compaction import EventRow as EventRow
