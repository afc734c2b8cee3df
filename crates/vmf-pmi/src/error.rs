//! The error type of both sides of the protocol.
use thiserror::Error;

/// Everything that can go wrong while speaking PMI-1. Every message reads "Unable to <op> since <why>".
#[derive(Debug, Error)]
pub enum PmiError {
    /// A read or write on the PMI connection failed.
    #[error("Unable to {op} since the PMI connection failed: {source}")]
    Io {
        /// The operation that failed.
        op: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The peer closed the connection before answering.
    #[error("Unable to {op} since the PMI peer closed the connection")]
    Eof {
        /// The operation that failed.
        op: String,
    },
    /// The peer sent a line that is not valid PMI-1.
    #[error("Unable to {op} since the PMI peer sent a malformed line ({why}): {line:?}")]
    Malformed {
        /// The operation that failed.
        op: String,
        /// What is wrong with the line.
        why: String,
        /// The line as received (possibly shortened).
        line: String,
    },
    /// The peer answered with a different command than the one expected.
    #[error(
        "Unable to {op} since the PMI server answered cmd={got} where cmd={expected} was expected"
    )]
    Unexpected {
        /// The operation that failed.
        op: String,
        /// The expected response command.
        expected: String,
        /// The command received.
        got: String,
    },
    /// The server answered with a nonzero `rc`.
    #[error("Unable to {op} since the PMI server answered rc={rc} ({msg})")]
    Failed {
        /// The operation that failed.
        op: String,
        /// The return code.
        rc: i64,
        /// The server's `msg=` text (or "no message").
        msg: String,
    },
    /// `get` of a key nobody has put (or not yet made visible by a fence).
    #[error("Unable to get key {key} since it is not in the key-value space ({msg})")]
    KeyNotFound {
        /// The key asked for.
        key: String,
        /// The server's `msg=` text.
        msg: String,
    },
    /// A key or value that cannot travel in PMI-1 (spaces, `=`, newlines, too long), or a bad call.
    #[error("Unable to {op} since {why}")]
    InvalidArgument {
        /// The operation that failed.
        op: String,
        /// What is wrong.
        why: String,
    },
    /// The environment (PMI_FD, PMI_PORT, PMI_RANK, ...) is unusable.
    #[error("Unable to {op} since {why}")]
    Environment {
        /// The operation that failed.
        op: String,
        /// What is wrong.
        why: String,
    },
}
