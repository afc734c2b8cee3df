//! MPI-1 graph topologies: Graph_create, Graphdims_get, Graph_get, Graph_neighbors(_count), Graph_map.
//!
//! A graph communicator keeps the program's `index`/`edges` arrays (`Topo::Graph`); the neighbours of
//! rank r are `edges[index[r-1]..index[r]]` in that order (duplicates and self-loops allowed, as the
//! standard allows). Those neighbours are both the sources and the destinations of the neighbour
//! collectives (`comm::topo_neighbors`). Like Cart_create, Graph_create keeps ranks 0..nnodes (no
//! reordering: every rank of one host is one shared-memory hop from every other) and gives the others
//! MPI_COMM_NULL.
use crate::comm::{ints, split, Topo};
use crate::*;
use std::ffi::c_int;

/// Neighbours of `rank` in a graph given by `index`/`edges` (`rank` must be a node).
pub(crate) fn neighbors_of<'a>(index: &[c_int], edges: &'a [c_int], rank: c_int) -> &'a [c_int] {
    let r = rank as usize;
    let lo = if r == 0 { 0 } else { index[r - 1] as usize };
    &edges[lo..index[r] as usize]
}

/// Check a graph description over a communicator of `size` ranks; returns (index, edges).
unsafe fn graph_args(
    size: c_int,
    nnodes: c_int,
    index: *const c_int,
    edges: *const c_int,
) -> R<(Vec<c_int>, Vec<c_int>)> {
    if nnodes < 0 {
        return err(MPI_ERR_ARG, format!("nnodes {nnodes} is negative"));
    }
    if nnodes > size {
        return err(
            MPI_ERR_ARG,
            format!("graph of {nnodes} nodes does not fit in {size} ranks"),
        );
    }
    let idx = ints(index, nnodes)?;
    let mut prev = 0;
    for (i, &x) in idx.iter().enumerate() {
        if x < prev {
            return err(MPI_ERR_ARG, format!("index[{i}] = {x} is smaller than index[{}] = {prev} (index must be non-decreasing and non-negative)", i.max(1) - 1));
        }
        prev = x;
    }
    let e = ints(edges, idx.last().copied().unwrap_or(0))?;
    if let Some((k, &x)) = e.iter().enumerate().find(|(_, &x)| x < 0 || x >= nnodes) {
        return err(
            MPI_ERR_ARG,
            format!("edges[{k}] = {x} is not a node of the graph (0..{nnodes})"),
        );
    }
    Ok((idx, e))
}

/// The graph topology of `comm`.
fn graph(st: &mut State, comm: MPI_Comm) -> R<(&Vec<c_int>, &Vec<c_int>, c_int)> {
    let c = st.comm(comm)?.1;
    match &c.topo {
        Some(Topo::Graph { index, edges }) => Ok((index, edges, c.size)),
        _ => err(
            MPI_ERR_TOPOLOGY,
            "communicator has no graph topology (MPI_Graph_create)",
        ),
    }
}

fn node(rank: c_int, nnodes: usize) -> R<c_int> {
    if rank < 0 || rank as usize >= nnodes {
        err(
            MPI_ERR_RANK,
            format!("rank {rank} is not a node of the graph (0..{nnodes})"),
        )
    } else {
        Ok(rank)
    }
}

mpi_api! {
    fn MPI_Graph_create / PMPI_Graph_create(comm_old: MPI_Comm, nnodes: c_int, indx: *const c_int, edges: *const c_int, _reorder: c_int, comm_graph: *mut MPI_Comm) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if comm_graph.is_null() { return err(MPI_ERR_ARG, "comm_graph is NULL"); }
            let (ci, c) = st.comm(comm_old)?;
            let (rank, size) = (c.rank, c.size);
            crate::intercomm::intra_only(c, "MPI_Graph_create")?;
            let (index, e) = graph_args(size, nnodes, indx, edges)?;
            let h = split(st, ci, if rank < nnodes { 0 } else { MPI_UNDEFINED }, rank)?;
            if h != MPI_COMM_NULL {
                st.comm(h)?.1.topo = Some(Topo::Graph { index, edges: e });
            }
            *comm_graph = h;
            Ok(())
        })();
        fin(comm_old, "MPI_Graph_create", r)
    }
    fn MPI_Graphdims_get / PMPI_Graphdims_get(comm: MPI_Comm, nnodes: *mut c_int, nedges: *mut c_int) -> c_int {
        let r = (|| -> R {
            let (index, _, _) = graph(state()?, comm)?;
            if nnodes.is_null() || nedges.is_null() { return err(MPI_ERR_ARG, "NULL argument"); }
            *nnodes = index.len() as c_int;
            *nedges = index.last().copied().unwrap_or(0);
            Ok(())
        })();
        fin(comm, "MPI_Graphdims_get", r)
    }
    fn MPI_Graph_get / PMPI_Graph_get(comm: MPI_Comm, maxindex: c_int, maxedges: c_int, indx: *mut c_int, edges: *mut c_int) -> c_int {
        let r = (|| -> R {
            let (index, e, _) = graph(state()?, comm)?;
            // As MPICH: arrays smaller than the graph are an error (no partial copy).
            if (maxindex as i64) < index.len() as i64 { return err(MPI_ERR_ARG, format!("maxindex {maxindex} is smaller than the number of nodes {}", index.len())); }
            if (maxedges as i64) < e.len() as i64 { return err(MPI_ERR_ARG, format!("maxedges {maxedges} is smaller than the number of edges {}", e.len())); }
            let (ni, ne) = (index.len(), e.len());
            if (ni > 0 && indx.is_null()) || (ne > 0 && edges.is_null()) { return err(MPI_ERR_ARG, "NULL array"); }
            std::ptr::copy_nonoverlapping(index.as_ptr(), indx, ni);
            std::ptr::copy_nonoverlapping(e.as_ptr(), edges, ne);
            Ok(())
        })();
        fin(comm, "MPI_Graph_get", r)
    }
    fn MPI_Graph_neighbors_count / PMPI_Graph_neighbors_count(comm: MPI_Comm, rank: c_int, nneighbors: *mut c_int) -> c_int {
        let r = (|| -> R {
            let (index, e, _) = graph(state()?, comm)?;
            let rank = node(rank, index.len())?;
            if nneighbors.is_null() { return err(MPI_ERR_ARG, "nneighbors is NULL"); }
            *nneighbors = neighbors_of(index, e, rank).len() as c_int;
            Ok(())
        })();
        fin(comm, "MPI_Graph_neighbors_count", r)
    }
    fn MPI_Graph_neighbors / PMPI_Graph_neighbors(comm: MPI_Comm, rank: c_int, maxneighbors: c_int, neighbors: *mut c_int) -> c_int {
        let r = (|| -> R {
            let (index, e, _) = graph(state()?, comm)?;
            let rank = node(rank, index.len())?;
            if maxneighbors < 0 { return err(MPI_ERR_ARG, "maxneighbors is negative"); }
            let nb = neighbors_of(index, e, rank);
            let n = nb.len().min(maxneighbors as usize);
            if n > 0 && neighbors.is_null() { return err(MPI_ERR_ARG, "neighbors is NULL"); }
            std::ptr::copy_nonoverlapping(nb.as_ptr(), neighbors, n);
            Ok(())
        })();
        fin(comm, "MPI_Graph_neighbors", r)
    }
    fn MPI_Graph_map / PMPI_Graph_map(comm: MPI_Comm, nnodes: c_int, indx: *const c_int, edges: *const c_int, newrank: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let c = st.comm(comm)?.1;
            let (rank, size) = (c.rank, c.size);
            crate::intercomm::intra_only(c, "MPI_Graph_map")?;
            graph_args(size, nnodes, indx, edges)?;
            if newrank.is_null() { return err(MPI_ERR_ARG, "newrank is NULL"); }
            // Identity placement (as Graph_create uses): ranks beyond the graph get no node.
            *newrank = if rank < nnodes { rank } else { MPI_UNDEFINED };
            Ok(())
        })();
        fin(comm, "MPI_Graph_map", r)
    }
}
