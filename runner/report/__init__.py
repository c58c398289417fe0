"""``probe-runner report``: a campaign at a glance, as one self-contained HTML file."""
