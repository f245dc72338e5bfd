"""Composition above the controllers: the controller registry, the evaluation protocols and their
plots, the training driver and serving; the CLIs call into it."""
