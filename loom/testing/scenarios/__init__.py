"""The shared runtime scenarios, each an importable async function taking a `Driver`.

Every scenario reads durable state back through the public API and raises `ScenarioFailure`
naming the rule a runtime broke; order is read in commit order (`Runtime.history`), never from a
sorted view. Each one calls `Driver.reopen` at settled step boundaries, so on a file store it runs
across closes and reopens. The index (one line per scenario, by area):

Causal bounds (`causal`)
    causal_depth_rate_replay_and_clock    depth 32 accepted and 33 refused; 128 per root per minute;
                                          a replay is never charged; the next minute restores rate,
                                          never depth
    concurrent_chain_budget               256 racing siblings, exactly 128 accepted; the fixed window
Routing and ownership (`routing`)
    concurrent_correlations_and_attempts  one Work per key, input in acceptance order; one attempt
    independent_work_progress             a blocked handler or launch for A never delays B
    first_match_replay_and_drop_audit     first match stops; drops are durable and audited; a handler's
                                          drop from a stale Work snapshot is re-evaluated
    multi_key_attachment_conflict_and_order  atomic key attachment (a free key before an owned one
                                          aborts too), unmatched and drop stay so, commit order,
                                          a stale Work snapshot is re-evaluated
Work identity and scopes (`ownership`)
    uncorrelated_and_terminal_successor   no key is unmatched; terminal Work and reopen successors
    scope_route_inheritance               routes replace in their slot; a binding is replaced, never merged
    unmatched_and_contradictory_target    unmatched is kept; contradictory targets are refused
Waits (`waits`)
    wait_event_registration_orders        match first and wait first wake once; own Events never wake it
    wait_timeout_acceptance_tie           the lowest accepted sequence wins, timeout included
    wait_cancel_orders                    cancel first and wake first
    wait_watermark_and_timeout_only       watermarks, timeout-only waits, resume against attempt N+1
Recovery and retry (`recovery`)
    lease_loss_adoption_and_stale_result  expiry is exclusive; adoption under a new epoch and token;
                                          not adoptable fails into retry; cancel refuses recovery
    retry_backoff_exhaustion_and_manual_event  +5, +10, +15 minutes on a four-attempt budget; the
                                          fourth failure holds; a manual retry resets the budget
    retry_cancel_orders                   a due retry then cancel; cancel then the retry's time
Active-event policies (`policies`)
    unsupported_policy_explicit_fallback  unsupported controls refused or take an explicit fallback
    completion_inject_orders              intents retain unconfirmed input; unrouted input blocks completion;
                                          only a dispatched inject intent's input can be proved consumed
Subscriptions (`subscriptions`)
    dependency_subscription_alias         a foreign key cannot be stolen; one deduplicated alias, caused by
                                          the original, wakes the dependent; no cross-scope alias without
                                          authorisation
"""

from .causal import causal_depth_rate_replay_and_clock as causal_depth_rate_replay_and_clock
from .causal import concurrent_chain_budget as concurrent_chain_budget
from .ownership import scope_route_inheritance as scope_route_inheritance
from .ownership import uncorrelated_and_terminal_successor as uncorrelated_and_terminal_successor
from .ownership import unmatched_and_contradictory_target as unmatched_and_contradictory_target
from .policies import completion_inject_orders as completion_inject_orders
from .policies import unsupported_policy_explicit_fallback as unsupported_policy_explicit_fallback
from .recovery import RECOVERY_SCENARIOS as RECOVERY_SCENARIOS
from .recovery import lease_loss_adoption_and_stale_result as lease_loss_adoption_and_stale_result
from .recovery import retry_backoff_exhaustion_and_manual_event as retry_backoff_exhaustion_and_manual_event
from .recovery import retry_cancel_orders as retry_cancel_orders
from .routing import concurrent_correlations_and_attempts as concurrent_correlations_and_attempts
from .routing import first_match_replay_and_drop_audit as first_match_replay_and_drop_audit
from .routing import independent_work_progress as independent_work_progress
from .routing import multi_key_attachment_conflict_and_order as multi_key_attachment_conflict_and_order
from .subscriptions import SUBSCRIPTION_SCENARIOS as SUBSCRIPTION_SCENARIOS
from .subscriptions import dependency_subscription_alias as dependency_subscription_alias
from .waits import WAIT_SCENARIOS as WAIT_SCENARIOS
from .waits import wait_cancel_orders as wait_cancel_orders
from .waits import wait_event_registration_orders as wait_event_registration_orders
from .waits import wait_timeout_acceptance_tie as wait_timeout_acceptance_tie
from .waits import wait_watermark_and_timeout_only as wait_watermark_and_timeout_only

CAUSAL_SCENARIOS = (causal_depth_rate_replay_and_clock, concurrent_chain_budget)
ROUTING_SCENARIOS = (
    concurrent_correlations_and_attempts,
    independent_work_progress,
    first_match_replay_and_drop_audit,
    multi_key_attachment_conflict_and_order,
    uncorrelated_and_terminal_successor,
    scope_route_inheritance,
    unsupported_policy_explicit_fallback,
    unmatched_and_contradictory_target,
    completion_inject_orders,
)
ALL_SCENARIOS = (
    CAUSAL_SCENARIOS + ROUTING_SCENARIOS + WAIT_SCENARIOS + RECOVERY_SCENARIOS + SUBSCRIPTION_SCENARIOS
)
