//! The CPU backend plugin (kernels filled in by the foundation work).
