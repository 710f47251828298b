//! The serving benchmark's parts: the wire-format parsers, the client that measures, and the
//! embedded server it measures by default.

pub mod client;
pub mod server;
pub mod stream;
