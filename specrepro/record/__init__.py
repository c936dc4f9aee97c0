"""The committed record: where results go and who may write them (results), the claims and their rules (scorecard),
its rendering into README blocks (report; the figures are drawn by :mod:`specrepro.lab.plots` and saved by results),
executed-notebook cleaning (nbclean) and the ``scorecard`` command (cli)."""
