"""The transports: what moves the data of a checked op, one module per transport.

=============  ==================================================================
``base``       :class:`Transport`, the interface every transport implements, and
               the sizes every transport computes alike
``shm``        the shared-memory engine (csrc/ccl) on one host
``native``     a chip's own collective library: HCCL / BKCL / RCCL / a plugin's
               (:class:`NativeTransport`), NCCL through CuPy (:class:`NcclTransport`)
``staged``     the base of the host-memory transports: device -> host, the op on
               host arrays, host -> device
``mpi``        MPI (mpi4py) between every pair of ranks
``hier``       shared memory within each host, MPI between hosts
``choose``     which of them a communicator gets: :func:`choose`
=============  ==================================================================
"""
