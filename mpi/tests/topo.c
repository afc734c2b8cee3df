/* Topologies: Dims_create, Cart_*, Dist_graph_*, neighbor collectives. */
#include "check.h"

static int R, N;

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    check_rank = R;
    int d2[2] = {0, 0};
    MPI_Dims_create(12, 2, d2);
    CHECK(d2[0] == 4 && d2[1] == 3);
    int d3[3] = {0, 3, 0};
    MPI_Dims_create(24, 3, d3);
    CHECK(d3[1] == 3 && d3[0] * d3[2] == 8 && d3[0] >= d3[2]);
    int dims[2] = {0, 0}, periods[2] = {1, 0};
    MPI_Dims_create(N, 2, dims);
    CHECK(dims[0] * dims[1] == N && dims[0] >= dims[1]);
    MPI_Comm cart;
    MPI_Cart_create(MPI_COMM_WORLD, 2, dims, periods, 0, &cart);
    int st;
    MPI_Topo_test(cart, &st);
    CHECK(st == MPI_CART);
    MPI_Topo_test(MPI_COMM_WORLD, &st);
    CHECK(st == MPI_UNDEFINED);
    int nd, co[2], gd[2], gp[2], gc[2];
    MPI_Cartdim_get(cart, &nd);
    CHECK(nd == 2);
    MPI_Cart_coords(cart, R, 2, co);
    CHECK(co[0] == R / dims[1] && co[1] == R % dims[1]);
    MPI_Cart_get(cart, 2, gd, gp, gc);
    CHECK(gd[0] == dims[0] && gp[0] == 1 && gp[1] == 0 && gc[0] == co[0] && gc[1] == co[1]);
    int rr;
    MPI_Cart_rank(cart, co, &rr);
    CHECK(rr == R);
    int src, dst;
    MPI_Cart_shift(cart, 0, 1, &src, &dst);
    CHECK(src == ((co[0] + dims[0] - 1) % dims[0]) * dims[1] + co[1]);
    CHECK(dst == ((co[0] + 1) % dims[0]) * dims[1] + co[1]);
    MPI_Cart_shift(cart, 1, 1, &src, &dst);
    CHECK(src == (co[1] == 0 ? MPI_PROC_NULL : R - 1));
    CHECK(dst == (co[1] == dims[1] - 1 ? MPI_PROC_NULL : R + 1));
    /* halo exchange along dim 0 */
    MPI_Cart_shift(cart, 0, 1, &src, &dst);
    int v = R, w = -1;
    MPI_Sendrecv(&v, 1, MPI_INT, dst, 0, &w, 1, MPI_INT, src, 0, cart, MPI_STATUS_IGNORE);
    CHECK(w == src);
    /* sub: keep dim 1 (rows) */
    int keep[2] = {0, 1};
    MPI_Comm row;
    MPI_Cart_sub(cart, keep, &row);
    int rs, rrk;
    MPI_Comm_size(row, &rs);
    MPI_Comm_rank(row, &rrk);
    CHECK(rs == dims[1] && rrk == co[1]);
    int sum;
    MPI_Allreduce(&R, &sum, 1, MPI_INT, MPI_SUM, row);
    CHECK(sum == co[0] * dims[1] * dims[1] + dims[1] * (dims[1] - 1) / 2);
    /* neighbor allgather on the cart: order (dim0 -, dim0 +, dim1 -, dim1 +) */
    int nb[4] = {-9, -9, -9, -9};
    MPI_Neighbor_allgather(&R, 1, MPI_INT, nb, 1, MPI_INT, cart);
    int s0, d0, s1, d1;
    MPI_Cart_shift(cart, 0, 1, &s0, &d0);
    MPI_Cart_shift(cart, 1, 1, &s1, &d1);
    if (dims[0] > 2 || dims[0] == 1) { /* with 2 periodic ranks both neighbours are the same rank */
        CHECK(nb[0] == s0 && nb[1] == d0);
    }
    CHECK(nb[2] == (s1 == MPI_PROC_NULL ? -9 : s1));
    CHECK(nb[3] == (d1 == MPI_PROC_NULL ? -9 : d1));
    MPI_Comm_free(&row);
    MPI_Comm_free(&cart);

    /* dist graph: ring, each rank sends to next and next-next (weighted) */
    int outs[2] = {(R + 1) % N, (R + 2) % N}, ins[2] = {(R + N - 1) % N, (R + N - 2) % N};
    int ow[2] = {1, 2}, iw[2] = {1, 2};
    MPI_Comm g;
    MPI_Dist_graph_create_adjacent(MPI_COMM_WORLD, 2, ins, iw, 2, outs, ow, MPI_INFO_NULL, 0, &g);
    MPI_Topo_test(g, &st);
    CHECK(st == MPI_DIST_GRAPH);
    int indeg, outdeg, weighted;
    MPI_Dist_graph_neighbors_count(g, &indeg, &outdeg, &weighted);
    CHECK(indeg == 2 && outdeg == 2 && weighted);
    int gs[2], gsw[2], gdn[2], gdw[2];
    MPI_Dist_graph_neighbors(g, 2, gs, gsw, 2, gdn, gdw);
    CHECK(gs[0] == ins[0] && gs[1] == ins[1] && gsw[1] == 2 && gdn[1] == outs[1] && gdw[0] == 1);
    int sb[2] = {R * 10 + 1, R * 10 + 2}, rb[2] = {-1, -1};
    MPI_Neighbor_alltoall(sb, 1, MPI_INT, rb, 1, MPI_INT, g);
    if (N > 2) CHECK(rb[0] == ins[0] * 10 + 1 && rb[1] == ins[1] * 10 + 2);
    int ag[2];
    MPI_Neighbor_allgather(&R, 1, MPI_INT, ag, 1, MPI_INT, g);
    CHECK(ag[0] == ins[0] && ag[1] == ins[1]);
    int rc[2] = {1, 1}, rd[2] = {1, 0}, av[2];
    MPI_Neighbor_allgatherv(&R, 1, MPI_INT, av, rc, rd, MPI_INT, g);
    CHECK(av[1] == ins[0] && av[0] == ins[1]);
    int sc[2] = {1, 1}, sd[2] = {0, 1}, vv[2];
    MPI_Neighbor_alltoallv(sb, sc, sd, MPI_INT, vv, rc, rd, MPI_INT, g);
    if (N > 2) CHECK(vv[1] == ins[0] * 10 + 1 && vv[0] == ins[1] * 10 + 2);
    MPI_Aint sdb[2] = {0, 4}, rdb[2] = {0, 4};
    MPI_Datatype ty[2] = {MPI_INT, MPI_INT};
    MPI_Neighbor_alltoallw(sb, sc, sdb, ty, vv, rc, rdb, ty, g);
    if (N > 2) CHECK(vv[0] == ins[0] * 10 + 1 && vv[1] == ins[1] * 10 + 2);
    MPI_Request rq;
    MPI_Ineighbor_allgather(&R, 1, MPI_INT, ag, 1, MPI_INT, g, &rq);
    MPI_Wait(&rq, MPI_STATUS_IGNORE);
    CHECK(ag[0] == ins[0]);
    /* persistent neighbor collectives (MPI 4.0): set up once, started with new data each time */
    {
        MPI_Request pr[5];
        int val = 0, pag[2], pav[2], pa2a[2], pv[2], pw[2], psb[2];
        MPI_Neighbor_allgather_init(&val, 1, MPI_INT, pag, 1, MPI_INT, g, MPI_INFO_NULL, &pr[0]);
        MPI_Neighbor_allgatherv_init(&val, 1, MPI_INT, pav, rc, rd, MPI_INT, g, MPI_INFO_NULL, &pr[1]);
        MPI_Neighbor_alltoall_init(psb, 1, MPI_INT, pa2a, 1, MPI_INT, g, MPI_INFO_NULL, &pr[2]);
        MPI_Neighbor_alltoallv_init(psb, sc, sd, MPI_INT, pv, rc, rd, MPI_INT, g, MPI_INFO_NULL, &pr[3]);
        MPI_Neighbor_alltoallw_init(psb, sc, sdb, ty, pw, rc, rdb, ty, g, MPI_INFO_NULL, &pr[4]);
        for (int it = 0; it < 6; it++) {
            val = R * 100 + it;
            psb[0] = R * 1000 + it * 10 + 1;
            psb[1] = R * 1000 + it * 10 + 2;
            for (int k = 0; k < 2; k++) pag[k] = pav[k] = pa2a[k] = pv[k] = pw[k] = -1;
            if (it % 2) {
                MPI_Startall(5, pr);
                MPI_Waitall(5, pr, MPI_STATUSES_IGNORE);
            } else {
                for (int k = 0; k < 5; k++) {
                    MPI_Start(&pr[k]);
                    MPI_Wait(&pr[k], MPI_STATUS_IGNORE);
                }
            }
            CHECK(pag[0] == ins[0] * 100 + it && pag[1] == ins[1] * 100 + it);
            CHECK(pav[1] == ins[0] * 100 + it && pav[0] == ins[1] * 100 + it);
            if (N > 2) {
                CHECK(pa2a[0] == ins[0] * 1000 + it * 10 + 1 && pa2a[1] == ins[1] * 1000 + it * 10 + 2);
                CHECK(pv[1] == ins[0] * 1000 + it * 10 + 1 && pv[0] == ins[1] * 1000 + it * 10 + 2);
                CHECK(pw[0] == ins[0] * 1000 + it * 10 + 1 && pw[1] == ins[1] * 1000 + it * 10 + 2);
            }
        }
        for (int k = 0; k < 5; k++) MPI_Request_free(&pr[k]);
        CHECK(pr[0] == MPI_REQUEST_NULL);
    }
    MPI_Comm_free(&g);
    /* non-adjacent dist graph: rank 0 declares every edge i -> (i+1)%N */
    {
        int n = R == 0 ? N : 0;
        int *srcs = malloc(sizeof(int) * N), *degs = malloc(sizeof(int) * N), *dsts = malloc(sizeof(int) * N);
        for (int i = 0; i < N; i++) { srcs[i] = i; degs[i] = 1; dsts[i] = (i + 1) % N; }
        MPI_Comm g2;
        MPI_Dist_graph_create(MPI_COMM_WORLD, n, srcs, degs, dsts, MPI_UNWEIGHTED, MPI_INFO_NULL, 0, &g2);
        MPI_Dist_graph_neighbors_count(g2, &indeg, &outdeg, &weighted);
        CHECK(indeg == 1 && outdeg == 1 && !weighted);
        int s1b, d1b;
        MPI_Dist_graph_neighbors(g2, 1, &s1b, MPI_UNWEIGHTED, 1, &d1b, MPI_UNWEIGHTED);
        CHECK(s1b == (R + N - 1) % N && d1b == (R + 1) % N);
        MPI_Comm_free(&g2);
        free(srcs); free(degs); free(dsts);
    }
    if (R == 0) printf("PASS topo\n");
    MPI_Finalize();
    return 0;
}
