//! One node of a running application: a rank of a vmfabric job (`vmfabric dvm run` starts them).
//!
//! Every rank allocates its part of one `vmf-rma` window: a page node its page-table entries and home
//! frames (the first also the synchronisation table), a compute node nothing. Co-resident ranks get
//! that memory in a shared segment, so when every rank maps every page node's memory the nodes use
//! loads, stores and CPU atomics on it and work on home frames in place ([`Direct`]); otherwise every
//! rank goes through the window's operations ([`Remote`]), which reach mapped members by load/store
//! and the others through their agent over TCP. All ranks agree on the mode through a counter on the
//! first page node.
use crate::app::{App, Role};
use crate::backend::{Backend, Direct, Remote};
use crate::sync::SyncTable;
use crate::vm::{Input, JobConsole, Node, NodeReport, Trap, VmOptions};
use std::time::Duration;
use vmf_core::Fabric;

/// How a node ended.
#[derive(Debug)]
pub enum NodeEnd {
    /// A page node served until every compute node finished.
    Page,
    Compute(NodeReport),
}

/// Why a node could not run.
#[derive(Debug)]
pub enum NodeError {
    Trap(Trap),
    Setup(String),
}

impl std::fmt::Display for NodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeError::Trap(t) => write!(f, "{t}"),
            NodeError::Setup(m) => write!(f, "{m}"),
        }
    }
}

/// Offset (in the synchronisation table's header) of the count of ranks that do not map every page
/// node.
const UNMAPPED: usize = 24;

/// Run this rank's node of `app`; `input` are the lines `in` instructions read.
pub fn run_node(fab: &Fabric, app: &App, input: Input) -> Result<NodeEnd, NodeError> {
    let setup = |m: String| NodeError::Setup(m);
    let rank = fab.rank();
    if fab.size() != app.nodes.len() {
        return Err(setup(format!(
            "the job has {} ranks but {} lists {} nodes",
            fab.size(),
            app.dir.join("nodes.txt").display(),
            app.nodes.len()
        )));
    }
    let layout = app.layout().map_err(|e| setup(e.to_string()))?;
    let mut win = vmf_rma::Win::allocate(fab, layout.window_bytes(rank)).map_err(|e| setup(format!("window: {e}")))?;
    let (sync_rank, sync_off) = layout.sync_home();
    let page_ranks: Vec<usize> = layout.nodes.iter().map(|n| n.rank).collect();
    let mapped: Vec<Option<*mut u8>> = (0..fab.size()).map(|t| win.raw().mapped(t)).collect();
    let all_mapped = page_ranks.iter().all(|&t| mapped[t].is_some());
    win.fetch_add_u64(sync_rank, sync_off + UNMAPPED, u64::from(!all_mapped))
        .map_err(|e| setup(format!("window: {e}")))?;
    if matches!(app.nodes[rank].role, Role::Compute { .. }) {
        // this node's first thread runs from now on, for the deadlock check (before the barrier: a node
        // that starts late must not look like a deadlock to one that blocks early)
        win.fetch_add_u64(sync_rank, sync_off + crate::sync::ALIVE, 1)
            .map_err(|e| setup(format!("window: {e}")))?;
    }
    win.flush_all().map_err(|e| setup(format!("window: {e}")))?;
    fab.barrier().map_err(|e| setup(format!("barrier: {e}")))?;
    let mut c = [0u8; 8];
    win.get(sync_rank, sync_off + UNMAPPED, &mut c).map_err(|e| setup(format!("window: {e}")))?;
    let direct = u64::from_ne_bytes(c) == 0;
    let spec = &app.nodes[rank];
    let Role::Compute { file, .. } = &spec.role else {
        // A page node: its memory is the service; wait for the compute nodes.
        fab.barrier().map_err(|e| setup(format!("barrier: {e}")))?;
        drop(win);
        return Ok(NodeEnd::Page);
    };
    let prog = &app.programs[file];
    let index = (rank - page_ranks.len()) as u64;
    let lease = Duration::from_micros(app.opts.lease_us.unwrap_or(if direct { 20 } else { 200 }));
    let opts = VmOptions {
        stack_words: app.opts.stack_words,
        lease,
        inplace: !app.opts.copy,
        jit: !app.opts.interpret,
    };
    let result = if direct {
        let bases = (0..fab.size())
            .map(|t| match (page_ranks.contains(&t), mapped[t]) {
                (true, Some(p)) => (p, layout.window_bytes(t)),
                _ => (std::ptr::null_mut(), 0),
            })
            .collect();
        let b = Direct::new(bases);
        let r = run_compute(spec.id, index, prog, &b, &layout, opts, input);
        drop(b);
        r
    } else {
        let b = Remote::new(win);
        let r = run_compute(spec.id, index, prog, &b, &layout, opts, input);
        win = b.into_inner();
        r
    };
    let report = result.map_err(NodeError::Trap)?;
    fab.barrier().map_err(|e| setup(format!("barrier: {e}")))?;
    drop(win);
    Ok(NodeEnd::Compute(report))
}

fn run_compute(
    id: u64,
    index: u64,
    prog: &crate::isa::Program,
    b: &dyn Backend,
    layout: &crate::space::Layout,
    opts: VmOptions,
    input: Input,
) -> Result<NodeReport, Trap> {
    let (t, off) = layout.sync_home();
    let console = JobConsole {
        input,
        sync: SyncTable::new(b, t, off),
    };
    let mut n = Node::new(id, index, prog, b, layout, opts, &console);
    n.main_counted = true;
    n.run()
}
