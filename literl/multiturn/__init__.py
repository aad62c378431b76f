"""Multi-turn episodes over the engine's own tokens: environments, the token bookkeeping between turns, and
the driver, and the collector that turns trajectories into training rows (chosen by `rollout.tools` /
`rollout.environment`; docs/multiturn.md).

Public API:
    run_episodes(generate, problems, env_factory, chat, caps) -> [Trajectory]     (`episodes`)
    EpisodeCaps, SampledTurn, TurnGenerator
    ChatFormat(tokenizer, family, tool_schemas)                                     (`chat_format`)
    Environment, StepResult, ToolEnvironment                                        (`environment`)
    Trajectory, TrainingSample, ModelTurn, END_REASONS                              (`trajectory`)
    truncate_observation, continuation, is_append_only, first_stop                  (`tokens`)
    multiturn_metrics(trajectories) -> {"multiturn/...": value}                    (`metrics`)
    MultiTurnSettings, build_episode_setup(settings, tokenizer) -> EpisodeSetup      (`setup`)
    MultiTurnCollector, trajectory_rows, check_append_only                         (`collector`)
"""

from literl.multiturn.chat_format import ChatFormat
from literl.multiturn.environment import Environment, StepResult, ToolEnvironment
from literl.multiturn.episodes import EpisodeCaps, SampledTurn, TurnGenerator, run_episodes
from literl.multiturn.metrics import multiturn_metrics
from literl.multiturn.setup import EpisodeSetup, MultiTurnSettings, build_episode_setup
from literl.multiturn.tokens import continuation, first_stop, is_append_only, truncate_observation
from literl.multiturn.trajectory import END_REASONS, ModelTurn, TrainingSample, Trajectory

__all__ = ["run_episodes", "EpisodeCaps", "SampledTurn", "TurnGenerator", "ChatFormat", "Environment",
           "StepResult", "ToolEnvironment", "Trajectory", "TrainingSample", "ModelTurn", "END_REASONS",
           "truncate_observation", "continuation", "is_append_only", "first_stop", "multiturn_metrics",
           "MultiTurnSettings", "EpisodeSetup", "build_episode_setup"]
