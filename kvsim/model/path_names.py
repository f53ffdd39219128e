"""The copy paths' names, in a module of their own: the command line offers them as choices
without importing the copy model (and its hardware schema) at start-up."""

PATHS = ("ce-page", "ce-batch", "kernel")
