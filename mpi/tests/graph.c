/* MPI-1 graph topologies: Graph_create/Graphdims_get/Graph_get/Graph_neighbors(_count)/Graph_map,
 * Topo_test, Cart_map, neighbor collectives on a graph communicator, error classes. */
#include "check.h"

static int R, N;

/* Graph over n nodes: a ring (i-1, i+1) plus an extra edge between 0 and every even node >= 2. It is
 * symmetric with multiplicities (n = 2 and n = 3 give duplicate edges), as neighbor collectives need. */
static int build(int n, int *index, int *edges)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (n > 1) {
            edges[k++] = (i + n - 1) % n;
            edges[k++] = (i + 1) % n;
        }
        if (i == 0) {
            for (int j = 2; j < n; j += 2)
                edges[k++] = j;
        } else if (i % 2 == 0) {
            edges[k++] = 0;
        }
        index[i] = k;
    }
    return k;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    check_rank = R;
    int index[64], edges[256];
    int ne = build(N, index, edges);

    MPI_Comm g;
    MPI_Graph_create(MPI_COMM_WORLD, N, index, edges, 0, &g);
    CHECK(g != MPI_COMM_NULL);
    int t;
    MPI_Topo_test(g, &t);
    CHECK(t == MPI_GRAPH);
    int gr, gs;
    MPI_Comm_rank(g, &gr);
    MPI_Comm_size(g, &gs);
    CHECK(gr == R && gs == N);
    int nn, nedges;
    MPI_Graphdims_get(g, &nn, &nedges);
    CHECK(nn == N && nedges == ne);
    int gi[64], ge[256];
    MPI_Graph_get(g, 64, 256, gi, ge);
    for (int i = 0; i < N; i++)
        CHECK(gi[i] == index[i]);
    for (int i = 0; i < ne; i++)
        CHECK(ge[i] == edges[i]);
    for (int r = 0; r < N; r++) {
        int cnt, nb[64];
        MPI_Graph_neighbors_count(g, r, &cnt);
        int lo = r == 0 ? 0 : index[r - 1];
        CHECK(cnt == index[r] - lo);
        MPI_Graph_neighbors(g, r, 64, nb);
        for (int k = 0; k < cnt; k++)
            CHECK(nb[k] == edges[lo + k]);
    }

    /* neighbor collectives: sources = destinations = my neighbour list, in order */
    int cnt, nb[64];
    MPI_Graph_neighbors_count(g, R, &cnt);
    MPI_Graph_neighbors(g, R, 64, nb);
    int sendv[2] = {R * 10, R * 10 + 1}, recvv[128];
    for (int i = 0; i < 128; i++)
        recvv[i] = -1;
    MPI_Neighbor_allgather(sendv, 2, MPI_INT, recvv, 2, MPI_INT, g);
    for (int k = 0; k < cnt; k++)
        CHECK(recvv[2 * k] == nb[k] * 10 && recvv[2 * k + 1] == nb[k] * 10 + 1);
    /* alltoall: to my k-th neighbour j I send 1000*R + j + 100*(occurrence of j so far in my list);
     * from j I expect 1000*j + R + 100*(occurrence of R so far in j's list), matched in order */
    int a2s[64], a2r[64], occ[64] = {0};
    for (int k = 0; k < cnt; k++)
        a2s[k] = 1000 * R + nb[k] + 100 * occ[nb[k]]++;
    MPI_Neighbor_alltoall(a2s, 1, MPI_INT, a2r, 1, MPI_INT, g);
    int seen[64] = {0};
    for (int k = 0; k < cnt; k++) {
        int j = nb[k];
        CHECK(a2r[k] == 1000 * j + R + 100 * seen[j]++);
    }
    /* nonblocking on a dup (the dup keeps the topology) */
    MPI_Comm gd;
    MPI_Comm_dup(g, &gd);
    MPI_Topo_test(gd, &t);
    CHECK(t == MPI_GRAPH);
    MPI_Request rq;
    for (int i = 0; i < 128; i++)
        recvv[i] = -1;
    MPI_Ineighbor_allgather(sendv, 1, MPI_INT, recvv, 1, MPI_INT, gd, &rq);
    MPI_Wait(&rq, MPI_STATUS_IGNORE);
    for (int k = 0; k < cnt; k++)
        CHECK(recvv[k] == nb[k] * 10);
    MPI_Comm_free(&gd);
    MPI_Comm_free(&g);

    /* fewer nodes than ranks: the rest get MPI_COMM_NULL; Graph_map agrees */
    int m = N > 1 ? N - 1 : 1;
    build(m, index, edges);
    MPI_Comm g2;
    MPI_Graph_create(MPI_COMM_WORLD, m, index, edges, 1, &g2);
    int nr;
    MPI_Graph_map(MPI_COMM_WORLD, m, index, edges, &nr);
    if (R < m) {
        CHECK(g2 != MPI_COMM_NULL && nr == R);
        int s;
        MPI_Allreduce(&R, &s, 1, MPI_INT, MPI_SUM, g2);
        CHECK(s == m * (m - 1) / 2);
        MPI_Comm_free(&g2);
    } else {
        CHECK(g2 == MPI_COMM_NULL && nr == MPI_UNDEFINED);
    }
    /* a graph of zero nodes */
    MPI_Comm g0;
    MPI_Graph_create(MPI_COMM_WORLD, 0, index, edges, 0, &g0);
    CHECK(g0 == MPI_COMM_NULL);

    /* Cart_map: row-major identity, ranks beyond the grid undefined */
    int dims[2] = {1, N > 1 ? N - 1 : 1}, per[2] = {0, 0};
    MPI_Cart_map(MPI_COMM_WORLD, 2, dims, per, &nr);
    CHECK(nr == (R < dims[0] * dims[1] ? R : MPI_UNDEFINED));

    /* errors */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    build(N, index, edges);
    MPI_Graph_create(MPI_COMM_WORLD, N, index, edges, 0, &g);
    MPI_Comm_set_errhandler(g, MPI_ERRORS_RETURN);
    CHECK_RC(MPI_Graph_neighbors_count(g, N, &cnt), MPI_ERR_RANK);
    CHECK_RC(MPI_Graph_neighbors(g, -1, 4, nb), MPI_ERR_RANK);
    CHECK_RC(MPI_Graphdims_get(MPI_COMM_WORLD, &nn, &nedges), MPI_ERR_TOPOLOGY);
    CHECK_RC(MPI_Graph_neighbors_count(MPI_COMM_WORLD, 0, &cnt), MPI_ERR_TOPOLOGY);
    int cd[1] = {N}, cp[1] = {0};
    MPI_Comm cart;
    MPI_Cart_create(MPI_COMM_WORLD, 1, cd, cp, 0, &cart);
    MPI_Comm_set_errhandler(cart, MPI_ERRORS_RETURN);
    CHECK_RC(MPI_Graph_get(cart, 4, 4, gi, ge), MPI_ERR_TOPOLOGY);
    /* arrays too small for the graph (as MPICH: an error, not a partial copy) */
    CHECK_RC(MPI_Graph_get(g, N - 1, 256, gi, ge), MPI_ERR_ARG);
    if (ne > 0)
        CHECK_RC(MPI_Graph_get(g, N, ne - 1, gi, ge), MPI_ERR_ARG);
    CHECK_RC(MPI_Cartdim_get(g, &nn), MPI_ERR_TOPOLOGY);
    MPI_Comm bad;
    CHECK_RC(MPI_Graph_create(MPI_COMM_WORLD, -1, index, edges, 0, &bad), MPI_ERR_ARG);
    CHECK_RC(MPI_Graph_create(MPI_COMM_WORLD, N + 1, index, edges, 0, &bad), MPI_ERR_ARG);
    int badedges[2] = {N, 0}, badindex[1] = {1};
    CHECK_RC(MPI_Graph_create(MPI_COMM_WORLD, 1, badindex, badedges, 0, &bad), MPI_ERR_ARG);
    int cbig[1] = {N + 1};
    CHECK_RC(MPI_Cart_map(MPI_COMM_WORLD, 1, cbig, cp, &nr), MPI_ERR_ARG);
    MPI_Comm_free(&cart);
    MPI_Comm_free(&g);

    MPI_Barrier(MPI_COMM_WORLD);
    if (R == 0)
        printf("PASS graph\n");
    MPI_Finalize();
    return 0;
}
