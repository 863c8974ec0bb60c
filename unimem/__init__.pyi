# Written from the lazy table in __init__.py by `python tests/test_public_api.py`; do not edit.
# Type checkers read this file in place of __init__.py: each public name keeps its type, while
# `import unimem` loads none of them.

from typing import Any

from unimem.api import capabilities as capabilities
from unimem.api import clear_cache as clear_cache
from unimem.api import configure as configure
from unimem.api import configure_from_env as configure_from_env
from unimem.api import reset_peak as reset_peak
from unimem.api import stats as stats
from unimem.api import summary as summary
from unimem.applied import Action as Action
from unimem.applied import Applied as Applied
from unimem.diagnose.guard import is_oom as is_oom
from unimem.diagnose.guard import oom_guard as oom_guard
from unimem.diagnose.report import OOMReport as OOMReport
from unimem.diagnose.report import Suggestion as Suggestion
from unimem.errors import BackendUnavailable as BackendUnavailable
from unimem.errors import ClusterError as ClusterError
from unimem.errors import ConfigError as ConfigError
from unimem.errors import OutOfMemory as OutOfMemory
from unimem.errors import SearchError as SearchError
from unimem.errors import TooLateError as TooLateError
from unimem.errors import UnimemError as UnimemError
from unimem.errors import UnimemWarning as UnimemWarning
from unimem.errors import UnsupportedFeature as UnsupportedFeature
from unimem.estimate.api import estimate_memory as estimate_memory
from unimem.estimate.result import MemoryEstimate as MemoryEstimate
from unimem.estimate.result import SizeEstimate as SizeEstimate
from unimem.in_force import BackendConfiguration as BackendConfiguration
from unimem.in_force import Configuration as Configuration
from unimem.in_force import configuration as configuration
from unimem.loss_scaling import LossScaler as LossScaler
from unimem.memory_stats import MemoryStats as MemoryStats
from unimem.observe.cluster import ClusterStats as ClusterStats
from unimem.observe.cluster import cluster_stats as cluster_stats
from unimem.observe.hook import MemoryHook as MemoryHook
from unimem.observe.monitor import Monitor as Monitor
from unimem.observe.monitor import monitor as monitor
from unimem.observe.plotting import RankLine as RankLine
from unimem.observe.plotting import RanksPlot as RanksPlot
from unimem.observe.profile import Profile as Profile
from unimem.observe.profile import profile as profile
from unimem.observe.recording import Recording as Recording
from unimem.observe.recording import load_recording as load_recording
from unimem.observe.recording import plot_recordings as plot_recordings
from unimem.observe.samples import Mark as Mark
from unimem.observe.samples import Sample as Sample
from unimem.observe.track import Tracked as Tracked
from unimem.observe.track import track as track
from unimem.pool_fragmentation import Fragmentation as Fragmentation
from unimem.pool_fragmentation import fragmentation as fragmentation
from unimem.ranks import RankInfo as RankInfo
from unimem.ranks import StrayMemory as StrayMemory
from unimem.ranks import local_device as local_device
from unimem.ranks import rank_info as rank_info
from unimem.ranks import rank_path as rank_path
from unimem.ranks import stray_memory as stray_memory
from unimem.registry import available_backends as available_backends
from unimem.search.batch_size import BatchSizeSearch as BatchSizeSearch
from unimem.search.batch_size import Trial as Trial
from unimem.search.batch_size import find_batch_size as find_batch_size
from unimem.sizes import format_bytes as format_bytes
from unimem.sizes import parse_size as parse_size
from unimem.support import Level as Level
from unimem.support import Phase as Phase
from unimem.support import Support as Support
from unimem.support import When as When
from unimem.training.accumulation import AccumulationPlan as AccumulationPlan
from unimem.training.accumulation import MicroBatch as MicroBatch
from unimem.training.accumulation import accumulate as accumulate
from unimem.training.accumulation import accumulate_grads as accumulate_grads
from unimem.training.accumulation import plan_accumulation as plan_accumulation
from unimem.training.precision import Policy as Policy
from unimem.training.precision import mixed_precision as mixed_precision
from unimem.training.savers import offload as offload
from unimem.training.savers import remat as remat
from unimem.training.savers import remat_model as remat_model

__version__: str

def __getattr__(name: str) -> Any: ...
