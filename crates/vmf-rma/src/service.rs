//! The origin's side of agent services ([`crate::agent::Service`]): a connection to one rank's agent that
//! carries requests for a service and brings back its answers, in order. The minitransactions' two-phase
//! commit talks to its remote memory nodes through it.
use crate::agent::Creds;
use crate::conn::Conn;
use crate::exec::Status;
use crate::wire::{Kind, ReqHeader};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

/// A connection to a rank's agent for service requests.
pub struct ServiceClient {
    c: Conn,
    /// Answer buffers of posted requests, by sequence number (kept here so that they stay put until the
    /// answer has been read into them).
    replies: HashMap<u64, Vec<u8>>,
}

// SAFETY: the raw destinations the connection keeps point into answer buffers this client owns (moved
// with it) or are null; nothing refers to another thread's memory.
unsafe impl Send for ServiceClient {}

impl std::fmt::Debug for ServiceClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ServiceClient(issued {}, done {})", self.c.issued, self.c.done)
    }
}

impl ServiceClient {
    /// Connect to the agent at `addr` of rank `dst` and authenticate as `creds.rank`. `spin`: how long a
    /// wait polls before it sleeps.
    pub fn connect(addr: SocketAddr, creds: &Creds, dst: u32, spin: Duration) -> std::io::Result<ServiceClient> {
        let s = crate::agent::connect(addr, creds, dst)?;
        Ok(ServiceClient {
            c: Conn::new(s, spin),
            replies: HashMap::new(),
        })
    }

    /// Send operation `op` of service `id` with the payload `parts` (concatenated), whose answer holds at
    /// most `cap` bytes. Returns the request's sequence number for [`ServiceClient::wait`]; does not wait.
    pub fn post(&mut self, id: u64, op: u8, parts: &[&[u8]], cap: usize) -> u64 {
        let h = header(id, op, parts);
        let mut buf = vec![0u8; cap];
        // SAFETY: `buf`'s heap block (cap bytes) is kept in `replies` until the answer is in.
        let seq = unsafe { self.c.send(&h, &[], parts, buf.as_mut_ptr(), cap, true) };
        self.replies.insert(seq, buf);
        seq
    }

    /// Wait for the answer to request `seq`: its bytes (as many as `cap` of the post; the service's
    /// answers say their own lengths), or why there is none.
    pub fn wait(&mut self, seq: u64) -> Result<Vec<u8>, String> {
        let r = self.c.wait(seq);
        let buf = self.replies.remove(&seq).unwrap_or_default();
        r?;
        match self.c.take_status(seq) {
            Some(Status::Ok) => Ok(buf),
            Some(s) => Err(format!("the agent answered {s:?}")),
            None => Err("no answer recorded".into()),
        }
    }

    /// Post and wait.
    pub fn call(&mut self, id: u64, op: u8, parts: &[&[u8]], cap: usize) -> Result<Vec<u8>, String> {
        let seq = self.post(id, op, parts, cap);
        self.wait(seq)
    }

    /// Send a request whose answer carries no bytes and that nobody waits for (its answer is read and
    /// dropped as later waits go by; a failure it reports is kept for [`ServiceClient::error`]). Returns
    /// once the request is written to the socket.
    pub fn post_nowait(&mut self, id: u64, op: u8, parts: &[&[u8]]) {
        let h = header(id, op, parts);
        // SAFETY: no answer bytes are accepted (cap 0), so the null destination is never written.
        unsafe { self.c.send(&h, &[], parts, std::ptr::null_mut(), 0, false) };
        // Written out now, not at the next use of the connection (which may never come): the request
        // often releases something at the other end.
        while !self.c.written() && self.c.broken.is_none() {
            self.c.pump();
            if !self.c.written() {
                let mut pfd = libc::pollfd { fd: self.c.fd(), events: libc::POLLOUT, revents: 0 };
                // SAFETY: one pollfd.
                unsafe { libc::poll(&mut pfd, 1, 100) };
            }
        }
    }

    /// Write what is queued and read answers that have arrived, without waiting. False once the
    /// connection is broken.
    pub fn pump(&mut self) -> bool {
        self.c.pump();
        self.c.broken.is_none()
    }

    /// The first failure reported for a request posted with [`ServiceClient::post_nowait`].
    pub fn error(&self) -> Option<Status> {
        self.c.error
    }

    /// Why the connection is unusable, if it is.
    pub fn broken(&self) -> Option<&str> {
        self.c.broken.as_deref()
    }
}

/// The header of a request for operation `op` of service `id` carrying `parts`.
fn header(id: u64, op: u8, parts: &[&[u8]]) -> ReqHeader {
    ReqHeader {
        kind: Kind::Service as u8,
        op,
        win: id,
        data_len: parts.iter().map(|p| p.len() as u64).sum(),
        ..Default::default()
    }
}
