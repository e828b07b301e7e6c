//! toast-cli: the command line of toast-rs.
fn main() {}
