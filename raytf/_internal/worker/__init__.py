"""The worker side: what runs inside raytf's actors. Modules that import TensorFlow are
imported only there (and by benchmarks), after the actor's devices are set."""
