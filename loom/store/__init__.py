"""The store: schema, migrations, `Tx` (the only place SQL lives) and the storage actor."""

from ._actor import CrashPoint as CrashPoint
from ._actor import FaultHook as FaultHook
from ._actor import NoticeFeed as NoticeFeed
from ._actor import StorageActor as StorageActor
from ._reader import ActorReader as ActorReader
from ._reader import Reader as Reader
from ._schema import SCHEMA_VERSION as SCHEMA_VERSION
from ._sqlite import SQLiteStore as SQLiteStore
from ._tx import Tx as Tx
