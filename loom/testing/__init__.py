"""Public test tools: clocks, the scenario `Driver`, fixtures, faults and the shared scenarios.

``loom.testing.scenarios`` holds the shared runtime scenarios as importable async
functions taking a driver; ``loom.testing.faults`` stops the storage actor at commit
boundaries; ``loom.testing.pytest_plugin`` provides fixtures.
"""

from .. import ManualClock as ManualClock
from .. import OffsetClock as OffsetClock
from ._driver import T0_MS as T0_MS
from ._driver import Driver as Driver
from ._driver import RuntimeDriver as RuntimeDriver
from ._driver import ScenarioHandlers as ScenarioHandlers
from ._driver import until_committed as until_committed
from ._driver import wait_routed as wait_routed
from ._fake import FakeExecutor as FakeExecutor
from ._fake import InjectAnswer as InjectAnswer
from ._fake import RecoverAnswer as RecoverAnswer
from ._scenario import ScenarioFailure as ScenarioFailure
