//! Wire format shared by all transports: the packet header and the version checked at connection time.
//!
//! Versions: 1 = initial format (32-byte header; kinds Eager, Rts, Cts, Data, Fin, SyncAck);
//! 2 = live migration (Moved, MovedAck, Ready); 3 = communicator revocation (Revoke);
//! 4 = sender-side single copy (`RtsInfo::write`, `CtsInfo::addr`/`pid`, `FLAG_WRITTEN` on a FIN).

/// Version of the packet format.
pub const PROTO_VERSION: u32 = 4;

/// Packet kinds.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A whole message: header + data.
    Eager = 1,
    /// Rendezvous request-to-send: header (len = total size) + [`RtsInfo`].
    Rts = 2,
    /// Clear-to-send for the pipelined rendezvous: [`CtsInfo`].
    Cts = 3,
    /// A chunk of a pipelined rendezvous: [`DataInfo`] + bytes.
    Data = 4,
    /// Rendezvous finished (receiver read the data by single copy): [`FinInfo`].
    Fin = 5,
    /// Acknowledgement of a synchronous-mode eager send: [`FinInfo`].
    SyncAck = 6,
    /// The sender moved (live migration): [`MovedInfo`]; last packet on the old channel.
    Moved = 7,
    /// Answer to `Moved`: everything before it on the old channel has been consumed; last packet there.
    MovedAck = 8,
    /// First packet on the new channel: the mover has drained the old one; the peer may use the new one.
    Ready = 9,
    /// Contexts revoked by the sender (MPIX_Comm_revoke): a list of little-endian u32 context ids.
    Revoke = 10,
}

impl Kind {
    /// Decode, rejecting unknown values.
    pub fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Eager,
            2 => Kind::Rts,
            3 => Kind::Cts,
            4 => Kind::Data,
            5 => Kind::Fin,
            6 => Kind::SyncAck,
            7 => Kind::Moved,
            8 => Kind::MovedAck,
            9 => Kind::Ready,
            10 => Kind::Revoke,
            _ => return None,
        })
    }
}

/// Header flag: the sender wants an acknowledgement when the message is matched (synchronous mode).
pub const FLAG_SYNC: u8 = 1;
/// Header flag of a FIN sent by the *sender* of a rendezvous: it wrote the whole message into the
/// receiver's buffer (sender-side single copy); the FIN names the receive request.
pub const FLAG_WRITTEN: u8 = 2;

/// Header of every packet (32 bytes, little-endian, `repr(C)`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PktHeader {
    /// A [`Kind`] value.
    pub kind: u8,
    /// Flags ([`FLAG_SYNC`]).
    pub flags: u8,
    /// Reserved, zero.
    pub _reserved: u16,
    /// Sending rank.
    pub src: u32,
    /// Message tag.
    pub tag: i32,
    /// Matching context (communicator).
    pub ctx: u32,
    /// Per-pair sequence number.
    pub seq: u64,
    /// Eager: payload bytes; Rts: total message bytes; others: kind-specific.
    pub len: u64,
}
/// Size of [`PktHeader`] on the wire.
pub const HDR_SIZE: usize = 32;
const _: () = assert!(std::mem::size_of::<PktHeader>() == HDR_SIZE);

impl PktHeader {
    /// A header.
    pub fn new(kind: Kind, src: u32, tag: i32, ctx: u32, seq: u64, len: u64) -> Self {
        PktHeader {
            kind: kind as u8,
            flags: 0,
            _reserved: 0,
            src,
            tag,
            ctx,
            seq,
            len,
        }
    }
    /// As bytes.
    pub fn as_bytes(&self) -> &[u8; HDR_SIZE] {
        // SAFETY: repr(C), no padding (size asserted = sum of fields), any bytes are valid.
        unsafe { &*(self as *const Self as *const [u8; HDR_SIZE]) }
    }
    /// Read a header from the start of `b` (unaligned read).
    ///
    /// # Safety
    /// `b` must point to at least [`HDR_SIZE`] readable bytes.
    #[inline(always)]
    pub unsafe fn read_from(b: *const u8) -> Self {
        std::ptr::read_unaligned(b as *const PktHeader)
    }
}

macro_rules! wire_struct {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $f:ident : $t:ty),* }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name { $($(#[$fm])* pub $f: $t),* }
        impl $name {
            /// Size on the wire.
            pub const SIZE: usize = std::mem::size_of::<$name>();
            /// As bytes.
            pub fn as_bytes(&self) -> &[u8] {
                // SAFETY: repr(C) of u64 fields only: no padding.
                unsafe { std::slice::from_raw_parts(self as *const Self as *const u8, Self::SIZE) }
            }
            /// Parse from the start of a payload; None if it is too short.
            pub fn parse(b: &[u8]) -> Option<Self> {
                if b.len() < Self::SIZE { return None; }
                // SAFETY: length checked; every bit pattern is a valid value.
                Some(unsafe { std::ptr::read_unaligned(b.as_ptr() as *const Self) })
            }
        }
    };
}

wire_struct!(
    /// Rendezvous request: where the sender's data is.
    RtsInfo {
        /// Sender's request id.
        sreq: u64,
        /// Address of the data in the sender (for single-copy reads).
        addr: u64,
        /// Sender's pid, or 0 if single copy is not offered.
        pid: u64,
        /// Region offset of the data when it lies in the sender's pool partition (the receiver copies it
        /// straight out of the shared region); 0: not offered.
        pool: u64,
        /// 1: the sender prefers to copy the data itself (`process_vm_writev`): the receiver answers with
        /// a CTS naming its buffer (`CtsInfo::addr`, `CtsInfo::pid`); 0: the receiver reads or asks for chunks.
        write: u64
    }
);
wire_struct!(
    /// Clear-to-send for the pipelined path.
    CtsInfo {
        /// Sender's request id.
        sreq: u64,
        /// Receiver's request id.
        rreq: u64,
        /// Bytes the receiver will take (the message, or less if its buffer is smaller).
        want: u64,
        /// Receiver's buffer address, for a sender-side single copy (with `pid`).
        addr: u64,
        /// Receiver's pid when it accepts a sender-side single copy into `addr`; 0: send DATA chunks.
        pid: u64
    }
);
wire_struct!(
    /// Header of a pipelined chunk.
    DataInfo {
        /// Receiver's request id.
        rreq: u64,
        /// Offset of this chunk in the message.
        offset: u64
    }
);
wire_struct!(
    /// Where a migrated rank is now.
    MovedInfo {
        /// Region UUID, high half.
        uuid0: u64,
        /// Region UUID, low half.
        uuid1: u64,
        /// Slot in that region.
        slot: u64,
        /// IPv4 address (host order) of its TCP listener, 0 if none.
        ip: u64,
        /// Port of its TCP listener.
        port: u64,
        /// When the migration started (CLOCK_MONOTONIC, ns; comparable between emulated hosts of one
        /// machine), for measuring the pause.
        t0_ns: u64
    }
);
wire_struct!(
    /// Completion notice for a send.
    FinInfo {
        /// Sender's request id.
        sreq: u64
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip_works() {
        let h = PktHeader::new(Kind::Rts, 3, -5, 9, 77, 1 << 40);
        let b = *h.as_bytes();
        assert_eq!(unsafe { PktHeader::read_from(b.as_ptr()) }, h);
    }

    #[test]
    fn unknown_kind_fails() {
        assert_eq!(Kind::from_u8(0), None);
        assert_eq!(Kind::from_u8(200), None);
        assert_eq!(Kind::from_u8(4), Some(Kind::Data));
    }

    #[test]
    fn short_payload_parse_fails() {
        assert!(RtsInfo::parse(&[0u8; RtsInfo::SIZE - 1]).is_none());
        let r = RtsInfo {
            sreq: 1,
            addr: 2,
            pid: 3,
            pool: 4,
            write: 1,
        };
        assert_eq!(RtsInfo::parse(r.as_bytes()), Some(r));
    }
}
