"""The committed record: where results go and who may write them (results), the claims and their rules (scorecard),
its rendering into README blocks and figures (report, plots), executed-notebook cleaning (nbclean) and the
``scorecard`` command (cli)."""
