//! The performance values of 003_*'s Figure 32, kept live in each node's block of the region so any
//! process (`vmfabric vnic stats`) reads them while the node runs. Each node writes only its own block.
use crate::hw::Hw;
use std::sync::atomic::{AtomicU64, Ordering};

/// Raw counter slots. The first 25 names are 003_*'s; the rest are raw sums the averages are computed
/// from and values the chapter-6 extensions are measured by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Slot {
    AllocatedPacketsMax = 0,
    /// Smallest packet sent, plus one (0: none sent).
    MinimumPacketSize,
    MaximumPacketSize,
    MaximumTxRetries,
    ExtraSignalsSent,
    QueuedPacketsMaximum,
    ImmediatePacketsTx,
    RxPackets,
    TxPackets,
    RxBytes,
    TxBytes,
    RxErrors,
    TxErrors,
    RxDropped,
    TxDropped,
    VlbLongestRoute,
    VlbRxIndirect,
    VlbRxDirect,
    VlbMaxSeenForeigners,
    /// Packets taken from the buffers while servicing signals (the numerator of packets per IRQ).
    IrqPackets,
    /// Signals serviced ("interrupts").
    Irqs,
    VlbTxIndirect,
    VlbTxDirect,
    VlbTxLimitedBySender,
    VlbTxLimitedByReceiver,
    /// Foreign packets passed on towards their destination.
    Forwarded,
    /// Signals raised.
    SignalsSent,
    /// Status words read in another node's memory (what unidirectional buffers remove).
    RemoteStatusReads,
    /// Times the direct buffer of a packet was busy.
    DirectBusy,
    /// Sends refused by a broken link.
    BrokenLinkHits,
    /// Foreign packets currently held (not a maximum: the live value).
    ForeignersHeld,
    /// 1 while the node runs.
    Up,
}

/// 003_*'s performance values, in Figure 32's order.
pub const NAMES: [&str; 25] = [
    "AllocatedPackets_Max",
    "AveragePacketSize",
    "MinimumPacketSize",
    "MaximumPacketSize",
    "MaximumTxRetries",
    "ExtraSignalsSent",
    "QueuedPackets_Maximum",
    "ImmediatePacketsTX",
    "rx_packets",
    "tx_packets",
    "rx_bytes",
    "tx_bytes",
    "rx_errors",
    "tx_errors",
    "rx_dropped",
    "tx_dropped",
    "VLB_LongestRoute",
    "VLB_RX_Indirect",
    "VLB_RX_Direct",
    "VLB_MaxSeenForeigners",
    "VLB_AveragePacketsPerIRQ",
    "VLB_TX_Indirect",
    "VLB_TX_Direct",
    "VLB_TX_LimitedBySender",
    "VLB_TX_LimitedByReceiver",
];

/// Further values vmfabric reports beside Figure 32's.
pub const EXTRA_NAMES: [&str; 6] = [
    "Forwarded",
    "SignalsSent",
    "IRQs",
    "RemoteStatusReads",
    "DirectBusy",
    "BrokenLinkHits",
];

/// Writer of one node's counters (the node alone writes them: plain load and store, no locked
/// instruction). Holds the address of the node's counter words: whoever makes one keeps the region
/// mapped for as long as it is used (the [`crate::Nic`] holds the region through its port).
#[derive(Clone, Copy)]
pub(crate) struct Counters {
    base: *const AtomicU64,
}

// SAFETY: a pointer into a process-shared mapping, used only through atomics.
unsafe impl Send for Counters {}

impl Counters {
    /// Counters of `node` in `hw`.
    pub(crate) fn new(hw: &Hw, node: usize) -> Self {
        Counters {
            base: hw.counter(node, 0) as *const AtomicU64,
        }
    }

    #[inline]
    fn slot(&self, s: usize) -> &AtomicU64 {
        debug_assert!(s < crate::hw::COUNTER_SLOTS);
        // SAFETY: COUNTER_SLOTS consecutive words start at `base` (hw::counter checked slot 0 and the node
        // block holds them all); the mapping outlives this value (see the type's comment).
        unsafe { &*self.base.add(s) }
    }

    /// Add `v` to `slot`.
    #[inline]
    pub(crate) fn add(&self, slot: Slot, v: u64) {
        let c = self.slot(slot as usize);
        c.store(c.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
    }

    /// Raise `slot` to at least `v`.
    #[inline]
    pub(crate) fn max(&self, slot: Slot, v: u64) {
        let c = self.slot(slot as usize);
        if v > c.load(Ordering::Relaxed) {
            c.store(v, Ordering::Relaxed);
        }
    }

    /// Set `slot` to `v`.
    #[inline]
    pub(crate) fn set(&self, slot: Slot, v: u64) {
        self.slot(slot as usize).store(v, Ordering::Relaxed);
    }

    /// Record a sent packet of `len` bytes.
    pub(crate) fn packet_size(&self, len: u64) {
        self.max(Slot::MaximumPacketSize, len);
        let c = self.slot(Slot::MinimumPacketSize as usize);
        let cur = c.load(Ordering::Relaxed);
        if cur == 0 || len + 1 < cur {
            c.store(len + 1, Ordering::Relaxed);
        }
    }

    /// Zero every counter.
    pub(crate) fn reset(&self) {
        for s in 0..crate::hw::COUNTER_SLOTS {
            self.slot(s).store(0, Ordering::Relaxed);
        }
    }
}

/// A snapshot of one node's values: Figure 32's 25 (averages computed) then [`EXTRA_NAMES`].
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// The node.
    pub node: usize,
    /// Whether the node is running.
    pub up: bool,
    /// `(name, value)` in [`NAMES`] then [`EXTRA_NAMES`] order.
    pub values: Vec<(&'static str, f64)>,
}

impl Snapshot {
    /// Read node `node`'s counters now.
    pub fn read(hw: &Hw, node: usize) -> Snapshot {
        let r = |s: Slot| hw.counter(node, s as usize).load(Ordering::Relaxed);
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        use Slot::*;
        let raw = [
            r(AllocatedPacketsMax) as f64,
            ratio(r(TxBytes), r(TxPackets)),
            r(MinimumPacketSize).saturating_sub(1) as f64,
            r(MaximumPacketSize) as f64,
            r(MaximumTxRetries) as f64,
            r(ExtraSignalsSent) as f64,
            r(QueuedPacketsMaximum) as f64,
            r(ImmediatePacketsTx) as f64,
            r(RxPackets) as f64,
            r(TxPackets) as f64,
            r(RxBytes) as f64,
            r(TxBytes) as f64,
            r(RxErrors) as f64,
            r(TxErrors) as f64,
            r(RxDropped) as f64,
            r(TxDropped) as f64,
            r(VlbLongestRoute) as f64,
            r(VlbRxIndirect) as f64,
            r(VlbRxDirect) as f64,
            r(VlbMaxSeenForeigners) as f64,
            ratio(r(IrqPackets), r(Irqs)),
            r(VlbTxIndirect) as f64,
            r(VlbTxDirect) as f64,
            r(VlbTxLimitedBySender) as f64,
            r(VlbTxLimitedByReceiver) as f64,
            r(Forwarded) as f64,
            r(SignalsSent) as f64,
            r(Irqs) as f64,
            r(RemoteStatusReads) as f64,
            r(DirectBusy) as f64,
            r(BrokenLinkHits) as f64,
        ];
        let values = NAMES
            .iter()
            .chain(EXTRA_NAMES.iter())
            .copied()
            .zip(raw)
            .collect();
        Snapshot {
            node,
            up: r(Up) == 1,
            values,
        }
    }

    /// The value called `name`.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.values.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
    }
}
