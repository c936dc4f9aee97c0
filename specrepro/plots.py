"""Shared figure style: one call, :func:`setup`, at the top of each notebook. Headless-safe (Agg outside Jupyter).

What it is not: the saving of figures (that is :func:`specrepro.results.save_figure`, which adds provenance).
"""

from __future__ import annotations

import os

__all__ = ["setup", "PAPER_STYLE"]

PAPER_STYLE = {"marker": "s", "linestyle": "--", "color": "0.35"}  # how the papers' numbers are drawn beside ours


def setup(context: str = "notebook"):
    """Seaborn whitegrid theme, colorblind palette, 150 dpi; returns the ``matplotlib.pyplot`` module."""
    import matplotlib

    if "JPY_PARENT_PID" not in os.environ and "ipykernel" not in os.environ.get("MPLBACKEND", ""):
        try:
            get_ipython()  # noqa: F821 - defined inside IPython kernels
        except NameError:
            matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(context=context, style="whitegrid", palette="colorblind")
    plt.rcParams.update({"figure.dpi": 110, "savefig.dpi": 150, "figure.figsize": (6.4, 4.0)})
    return plt
