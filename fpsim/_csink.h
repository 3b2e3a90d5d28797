/* The one interface between fpsim/_ckernel.c (the rounding kernel) and fpsim/_carith.c (counts, encoders):
 * a "sink" takes each block of rounded carrier words straight from the kernel, while the block is in the
 * L1 cache, so that fpsim.analyze and fpsim.to_bits read their input once and write no rounded temporary.
 *
 * _carith.c makes sinks (PyCapsules named FPSIM_SINK_CAPSULE whose pointer starts with an fpsim_sink_t);
 * _ckernel.round_bits(..., sink) rounds each job's elements in blocks into a buffer of its own and calls
 * fn on every block, from the job's thread: job is the job's index (0..63; a sink keeps what it adds up per
 * job, so no two threads write the same place), lo the block's first element within the call, in and r
 * the block's input and rounded words (n carrier words of W bits each). fn runs without the GIL. */
#ifndef FPSIM_CSINK_H
#define FPSIM_CSINK_H

#define FPSIM_SINK_CAPSULE "fpsim._carith.sink"
#define FPSIM_SINK_JOBS 64

typedef struct fpsim_sink fpsim_sink_t;
struct fpsim_sink {
    void (*fn)(fpsim_sink_t *s, int job, const void *in, const void *r, Py_ssize_t lo, Py_ssize_t n);
    int W; /* the carrier width the sink reads: 32 or 64 */
};

#endif
