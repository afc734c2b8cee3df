//! The self transport: packets a rank sends to itself, kept in a local queue.
use crate::proto::PktHeader;
use crate::{Incoming, Transport, TransportError};
use std::collections::VecDeque;

/// Loopback queue for messages to oneself. Payload buffers are recycled, so steady-state use does not allocate.
pub struct SelfTransport {
    me: usize,
    queue: VecDeque<(PktHeader, Vec<u8>)>,
    free: Vec<Vec<u8>>,
}

impl SelfTransport {
    /// True if nothing is queued (cheap; lets the progress engine skip the poll).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The self transport of rank `me`.
    pub fn new(me: usize) -> Self {
        SelfTransport {
            me,
            queue: VecDeque::new(),
            free: Vec::new(),
        }
    }
}

impl Transport for SelfTransport {
    type Token = Vec<u8>;

    fn name(&self) -> &'static str {
        "self"
    }

    fn reaches(&self, peer: usize) -> bool {
        peer == self.me
    }

    fn max_payload(&self, _peer: usize) -> usize {
        usize::MAX
    }

    fn try_send(
        &mut self,
        peer: usize,
        hdr: &PktHeader,
        a: &[u8],
        b: &[u8],
    ) -> Result<bool, TransportError> {
        if peer != self.me {
            return Err(TransportError::Unreachable {
                peer,
                transport: "self",
            });
        }
        let mut buf = self.free.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(a);
        buf.extend_from_slice(b);
        self.queue.push_back((*hdr, buf));
        Ok(true)
    }

    fn poll(&mut self) -> Result<Option<Incoming<Vec<u8>>>, TransportError> {
        Ok(self
            .queue
            .pop_front()
            .map(|(h, buf)| Incoming::new(self.me, h, buf.as_ptr(), buf.len(), buf)))
    }

    fn release(&mut self, inc: Incoming<Vec<u8>>) {
        if self.free.len() < 64 {
            self.free.push(inc.token);
        }
    }
}
