"""The live training dashboard (:mod:`.app`, the page in ``page.html``) and the trajectory samples a
run writes for it (:mod:`.records`). ``agentrl dashboard RUN_DIR`` serves it; README "Dashboard"."""

from agentrl.dashboard.app import make_dashboard, plotly_path
from agentrl.dashboard.records import read_trajectories, sample_files, sample_records, write_samples

__all__ = ["make_dashboard", "plotly_path", "read_trajectories", "sample_files", "sample_records", "write_samples"]
