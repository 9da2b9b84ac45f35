"""Commit notices, as `Runtime.watch` yields them (public frozen records; see `loom.records.notices`)."""

from .records.notices import AttemptEnded as AttemptEnded
from .records.notices import AttemptFailed as AttemptFailed
from .records.notices import AttemptStarted as AttemptStarted
from .records.notices import Committed as Committed
from .records.notices import EventAccepted as EventAccepted
from .records.notices import EventReplayed as EventReplayed
from .records.notices import EventRouted as EventRouted
from .records.notices import ExecutionFenced as ExecutionFenced
from .records.notices import IntentPending as IntentPending
from .records.notices import Lagged as Lagged
from .records.notices import LeaseExpiry as LeaseExpiry
from .records.notices import LeaseRecovered as LeaseRecovered
from .records.notices import Notice as Notice
from .records.notices import StoreChanged as StoreChanged
from .records.notices import SubscriptionChanged as SubscriptionChanged
from .records.notices import TimerArmed as TimerArmed
from .records.notices import TimerCancelled as TimerCancelled
from .records.notices import TimerFired as TimerFired
from .records.notices import WorkChanged as WorkChanged
from .records.notices import WorkReady as WorkReady
from .records.notices import WorkSettled as WorkSettled
