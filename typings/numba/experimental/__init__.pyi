from numba.experimental import structref as structref
