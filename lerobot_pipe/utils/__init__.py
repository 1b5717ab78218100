"""The foundation layer: fault points, seeding and keyed randomness, Hub repo ids. Its modules
import nothing of the package but constants, fsutil and each other; every layer may use them."""
