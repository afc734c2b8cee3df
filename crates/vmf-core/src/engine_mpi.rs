//! Engine operations used by the MPI library (`vmf-mpi`). A child module of `engine`, so it may use the
//! engine's private state; everything here is additive.
