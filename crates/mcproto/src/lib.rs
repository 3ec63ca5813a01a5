//! `mcproto`: the memcached text protocol (and the binary one, translated to
//! it: [`binary`]) without sockets or threads.
//!
//! Everything here works on byte slices: [`parse_request`] and [`parse_response`]
//! read from the front of a buffer and say how many bytes they used (or that
//! more are needed); [`Request::encode`], [`Response::encode`] and the
//! `encode_*` helpers append to a `Vec<u8>`. The proxy and the load generator
//! share this crate, so both speak exactly the same protocol. [`ring`] places
//! keys on servers the way libmemcached and twemproxy do (pure computation too).

pub mod auth;
pub mod binary;
pub mod buffer;
pub mod hashkit;
pub mod number;
pub mod parse;
pub mod request;
pub mod response;
pub mod ring;

pub use buffer::ReadBuf;
pub use parse::{parse_request, Limits, Parsed, Rejection};
pub use request::{encode_get, encode_store_line, ArithKind, GetKind, MetaKind, Request, StoreKind};
pub use response::{
    delete_reply_len, encode_value, meta_reply_len, parse_response, response_len, retrieval_reply_len,
    status_reply_len, MalformedResponse, Response, ValueRef,
};
