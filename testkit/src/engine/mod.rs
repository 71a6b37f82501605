//! The engine tests' shared setup (feature `engine`): the reference model
//! ([`model_path`], [`model`]), a direct driver of the forward pass with no
//! scheduler ([`driver`]), requests to a running scheduler from a blocking
//! test ([`requests`]), the real engine behind the OpenAI HTTP API on
//! 127.0.0.1:0 ([`server`]), and a scripted scheduler stand-in behind the same
//! API with a small hyper client ([`http`]), and real engines served for
//! what stands in front of them, recording what reached them ([`serve`]).

pub mod driver;
pub mod http;
mod model;
pub mod requests;
pub mod serve;
pub mod server;

pub use model::{model, model_path};
