//! Transports (layer 2 of vmfabric): move packets between ranks, nothing more.
//!
//! A transport knows how to deliver a [`proto::PktHeader`] plus a payload to a peer and how to hand back the
//! packets that arrived. Matching, protocols (eager, rendezvous) and progress live in `vmf-core`. Sending
//! never blocks: a full queue answers `Ok(false)` ("no resource") and the caller keeps the packet pending,
//! as UCX's `pending_add` and the seed's "schedule for later" do.
//!
//! Implementations: [`shm::ShmTransport`] (co-resident ranks, one region per host), [`selfq::SelfTransport`]
//! (a rank to itself). TCP follows.
//!
//! # Examples
//! ```
//! use vmf_transport::{proto::{PktHeader, Kind}, selfq::SelfTransport, Transport};
//! let mut t = SelfTransport::new(0);
//! let hdr = PktHeader::new(Kind::Eager, 0, 7, 0, 0, 5);
//! assert!(t.try_send(0, &hdr, &[], b"hello").unwrap());
//! let inc = t.poll().unwrap().unwrap();
//! assert_eq!(inc.hdr.tag, 7);
//! assert_eq!(unsafe { inc.payload() }, b"hello");
//! t.release(inc);
//! ```
#![warn(missing_docs)]

pub mod mphw;
pub mod proto;
pub mod selfq;
pub mod shm;
pub mod tcp;

use proto::PktHeader;
use thiserror::Error;

/// Errors a transport reports. Each names the peer involved.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum TransportError {
    /// Shared memory written by `peer` is inconsistent (corrupted or hostile).
    #[error("shared memory from rank {peer} is corrupt: {what}")]
    Corrupt {
        /// Peer rank.
        peer: usize,
        /// What was found.
        what: String,
    },
    /// The peer process no longer exists.
    #[error("rank {peer} (pid {pid}) is dead")]
    PeerDead {
        /// Peer rank.
        peer: usize,
        /// Its pid.
        pid: i32,
    },
    /// The transport cannot reach this peer.
    #[error("rank {peer} is not reachable through {transport}")]
    Unreachable {
        /// Peer rank.
        peer: usize,
        /// Transport name.
        transport: &'static str,
    },
    /// The packet is larger than the transport can carry in one piece.
    #[error("packet of {len} bytes to rank {peer} exceeds the transport limit of {max}")]
    TooLarge {
        /// Peer rank.
        peer: usize,
        /// Requested size.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// A connection to the peer failed or was closed.
    #[error("the connection to rank {peer} was lost: {why}")]
    ConnectionLost {
        /// Peer rank.
        peer: usize,
        /// What happened.
        why: String,
    },
    /// Setting up the transport failed.
    #[error("{0}")]
    Setup(String),
}

/// A packet handed out by [`Transport::poll`]; its payload stays valid until [`Transport::release`].
pub struct Incoming<T> {
    /// Sending rank (validated against the queue it came from).
    pub peer: usize,
    /// The packet header (a copy).
    pub hdr: PktHeader,
    payload: *const u8,
    len: usize,
    /// Bytes of this packet's data that the transport already wrote straight into the destination chosen
    /// by the placement callback (see [`Transport::poll_placed`]); 0 otherwise.
    pub placed: usize,
    /// Transport-specific token needed to release the packet.
    pub token: T,
}

impl<T> Incoming<T> {
    /// Construct (for transport implementations).
    pub fn new(peer: usize, hdr: PktHeader, payload: *const u8, len: usize, token: T) -> Self {
        Incoming {
            peer,
            hdr,
            payload,
            len,
            placed: 0,
            token,
        }
    }
    /// Payload length.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for an empty payload.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Raw payload pointer.
    pub fn payload_ptr(&self) -> *const u8 {
        self.payload
    }
    /// The payload.
    ///
    /// # Safety
    /// Only until the packet is released.
    pub unsafe fn payload(&self) -> &[u8] {
        if self.len == 0 {
            &[]
        } else {
            std::slice::from_raw_parts(self.payload, self.len)
        }
    }
}

/// The placement callback of [`Transport::poll_placed`]: given the peer, the header and the bytes
/// received so far, where the payload should go (None: the transport keeps it).
pub type Place<'a> = dyn FnMut(usize, &PktHeader, &[u8]) -> Option<*mut u8> + 'a;

/// The contract every transport fulfils.
pub trait Transport {
    /// Release token of an incoming packet.
    type Token;
    /// Short name ("shm", "self", "tcp").
    fn name(&self) -> &'static str;
    /// True if `peer` can be reached.
    fn reaches(&self, peer: usize) -> bool;
    /// Largest `a.len() + b.len()` one packet to `peer` may carry.
    fn max_payload(&self, peer: usize) -> usize;
    /// Send a header and a payload gathered from `a` then `b`. `Ok(false)`: no resource now, retry later.
    fn try_send(
        &mut self,
        peer: usize,
        hdr: &PktHeader,
        a: &[u8],
        b: &[u8],
    ) -> Result<bool, TransportError>;
    /// The next arrived packet, if any. Never blocks.
    fn poll(&mut self) -> Result<Option<Incoming<Self::Token>>, TransportError>;
    /// Return a packet's resources.
    fn release(&mut self, inc: Incoming<Self::Token>);

    /// Like [`Transport::try_send`], but `b` stays valid and unmodified until [`Transport::has_backlog`]
    /// says false for this peer, so a transport may keep pointing at it instead of copying (large data).
    fn try_send_borrowed(
        &mut self,
        peer: usize,
        hdr: &PktHeader,
        a: &[u8],
        b: &[u8],
    ) -> Result<bool, TransportError> {
        self.try_send(peer, hdr, a, b)
    }

    /// True while bytes handed to [`Transport::try_send_borrowed`] for `peer` are still referenced.
    fn has_backlog(&self, _peer: usize) -> bool {
        false
    }

    /// Like [`Transport::poll`], but for packets whose data has a known destination (`place(peer, hdr, a)`
    /// returns it, or None) a transport that reads from a stream may read the data straight there and
    /// report it in [`Incoming::placed`].
    fn poll_placed(
        &mut self,
        _place: &mut Place<'_>,
    ) -> Result<Option<Incoming<Self::Token>>, TransportError> {
        self.poll()
    }

    /// The next packet from `peer` alone, looking at nothing else (a receiver that waits for one sender
    /// watches that sender's channel only), placed like [`Transport::poll_placed`]. `None` when there is
    /// none, and also when this transport cannot look at one peer by itself right now (no channel yet, a
    /// send to it still queued): the caller then polls in full. Never blocks. The default looks at nothing.
    fn poll_from(
        &mut self,
        _peer: usize,
        _place: &mut Place<'_>,
    ) -> Result<Option<Incoming<Self::Token>>, TransportError> {
        Ok(None)
    }
}
