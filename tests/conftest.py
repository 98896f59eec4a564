import jax


# float64 cases need x64; float32 cases create float32 arrays explicitly.
jax.config.update("jax_enable_x64", True)
