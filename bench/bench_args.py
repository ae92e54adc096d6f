"""The command line the PyTorch benchmark scripts share: sizes and counts as integer options."""

import argparse


def int_options(description=None, **defaults):
    """An ArgumentParser with one integer option per keyword (`overhead_rows=8192` gives
    `--overhead-rows`, default 8192), in the keywords' order; callers add the rest."""
    parser = argparse.ArgumentParser(description=description)
    for name, default in defaults.items():
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=default)
    return parser
