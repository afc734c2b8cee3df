//! The agent protocol: what an origin sends to a target's agent over TCP, and what comes back.
//!
//! After the handshake (see [`crate::agent`]) a connection carries requests, each answered by exactly one
//! response, in order:
//!
//! ```text
//! request:  [ReqHeader: 48 bytes][runs: nruns x 32 bytes][data: data_len bytes]
//! response: [RespHeader: 16 bytes][data: len bytes]
//! ```
//!
//! Every field is little-endian and validated by the receiver before use: unknown kinds, elements or
//! operations, run counts beyond [`MAX_RUNS`], payloads beyond [`MAX_DATA`], and lengths that disagree
//! with the layout are refused (the connection is closed), never trusted.

/// Kinds of request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Write `data` into the layout.
    Put = 1,
    /// Read the layout; the response carries its bytes.
    Get = 2,
    /// Accumulate `data` into the layout.
    Acc = 3,
    /// Accumulate and return the old contents (get-accumulate, fetch-and-op).
    GetAcc = 4,
    /// Compare-and-swap one element: `data` is the compare value then the new value.
    Cas = 5,
    /// Try once to take the passive-target lock (flag [`FLAG_EXCL`] for exclusive).
    Lock = 6,
    /// Release the passive-target lock.
    Unlock = 7,
    /// Answered once every earlier request of the connection is done (remote completion).
    Flush = 8,
    /// A request for a service registered with the agent ([`crate::agent::Service`]): `win` names the
    /// service, `op` its operation, `data` its payload; no runs. The response carries what it answers.
    Service = 9,
}

impl Kind {
    /// The kind with code `v`.
    pub fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Put,
            2 => Kind::Get,
            3 => Kind::Acc,
            4 => Kind::GetAcc,
            5 => Kind::Cas,
            6 => Kind::Lock,
            7 => Kind::Unlock,
            8 => Kind::Flush,
            9 => Kind::Service,
            _ => return None,
        })
    }
}

/// Lock flag: exclusive.
pub const FLAG_EXCL: u8 = 1;
/// Bytes of a request header.
pub const REQ_HDR: usize = 48;
/// Bytes of a response header.
pub const RESP_HDR: usize = 16;
/// Most runs in one request's layout.
pub const MAX_RUNS: usize = 1 << 16;
/// Largest payload of one request or response.
pub const MAX_DATA: u64 = 1 << 31;

/// A request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ReqHeader {
    /// [`Kind`] code.
    pub kind: u8,
    /// [`crate::reduce::Elem`] code (accumulates, compare-and-swap).
    pub elem: u8,
    /// [`crate::reduce::ROp`] code (accumulates).
    pub op: u8,
    /// Flags ([`FLAG_EXCL`]).
    pub flags: u8,
    /// Runs that follow.
    pub nruns: u32,
    /// The window at the agent.
    pub win: u64,
    /// Byte displacement in the member's memory (an address for dynamic windows).
    pub disp: u64,
    /// Elements of the layout.
    pub count: u64,
    /// Distance between elements.
    pub extent: i64,
    /// Payload bytes after the runs.
    pub data_len: u64,
}

impl ReqHeader {
    /// Encode into `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[self.kind, self.elem, self.op, self.flags]);
        out.extend_from_slice(&self.nruns.to_le_bytes());
        out.extend_from_slice(&self.win.to_le_bytes());
        out.extend_from_slice(&self.disp.to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.extent.to_le_bytes());
        out.extend_from_slice(&self.data_len.to_le_bytes());
    }

    /// Decode (the caller passes exactly [`REQ_HDR`] bytes); `None` for an unknown kind or a count of
    /// runs or payload bytes beyond the limits.
    pub fn decode(b: &[u8]) -> Option<ReqHeader> {
        let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let h = ReqHeader {
            kind: b[0],
            elem: b[1],
            op: b[2],
            flags: b[3],
            nruns: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            win: u(8),
            disp: u(16),
            count: u(24),
            extent: u(32) as i64,
            data_len: u(40),
        };
        (Kind::from_u8(h.kind).is_some()
            && (h.nruns as usize) <= MAX_RUNS
            && h.data_len <= MAX_DATA)
            .then_some(h)
    }
}

/// Response flag: the agent's own thread served the request because the target rank was busy outside
/// the library (its waiting thread serves otherwise): the origin then does better to sleep than to spin
/// for the next answers, leaving the CPU to the agent.
pub const RESP_BY_AGENT_THREAD: u32 = 1;

/// A response header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RespHeader {
    /// [`crate::exec::Status`] code.
    pub status: u32,
    /// Flags ([`RESP_BY_AGENT_THREAD`]).
    pub flags: u32,
    /// Payload bytes that follow.
    pub len: u64,
}

impl RespHeader {
    /// Encode into `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.status.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
    }

    /// Decode exactly [`RESP_HDR`] bytes.
    pub fn decode(b: &[u8]) -> RespHeader {
        RespHeader {
            status: u32::from_le_bytes(b[..4].try_into().unwrap()),
            flags: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            len: u64::from_le_bytes(b[8..16].try_into().unwrap()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_limits_hold() {
        let h = ReqHeader {
            kind: Kind::GetAcc as u8,
            elem: 4,
            op: 3,
            flags: 0,
            nruns: 2,
            win: 9,
            disp: 1 << 40,
            count: 3,
            extent: -24,
            data_len: 48,
        };
        let mut v = Vec::new();
        h.encode(&mut v);
        assert_eq!(v.len(), REQ_HDR);
        assert_eq!(ReqHeader::decode(&v), Some(h));
        v[0] = 99;
        assert_eq!(ReqHeader::decode(&v), None, "unknown kind");
        v[0] = 1;
        v[4..8].copy_from_slice(&(MAX_RUNS as u32 + 1).to_le_bytes());
        assert_eq!(ReqHeader::decode(&v), None, "too many runs");
        let r = RespHeader {
            status: 1,
            flags: RESP_BY_AGENT_THREAD,
            len: 77,
        };
        let mut w = Vec::new();
        r.encode(&mut w);
        assert_eq!(w.len(), RESP_HDR);
        assert_eq!(RespHeader::decode(&w), r);
    }
}
