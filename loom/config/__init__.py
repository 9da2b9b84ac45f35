"""Configuration: the records (`model`), route and binding resolution (`resolve`),
the TOML reader (`reader`), `Config` itself, and the generation in force (`holder`)."""

from .config import Config as Config
from .config import effective_bindings as effective_bindings
from .config import effective_routes as effective_routes
from .holder import ConfigHolder as ConfigHolder
from .model import Binding as Binding
from .model import Budget as Budget
from .model import BudgetPer as BudgetPer
from .model import BudgetWindow as BudgetWindow
from .model import CausalLimits as CausalLimits
from .model import EffectiveBinding as EffectiveBinding
from .model import EffectiveRoute as EffectiveRoute
from .model import Route as Route
from .model import ScopeConfig as ScopeConfig
from .model import StoreConfig as StoreConfig
from .model import Synchronous as Synchronous
from .model import WorkKindPolicy as WorkKindPolicy
from .model import retry_delays as retry_delays
from .resolve import scope_ancestry as scope_ancestry
