"""Scaffolding shared by the kernel packages: block-size validation
(``blocks``), padding and layout (``layout``), platform dispatch
(``dispatch``), float32-accumulated matmuls (``dots``) and the compiler
settings and cost estimates of a ``pallas_call`` (``compiler``). A kernel
package keeps only its math: the kernel bodies, their grids and specs.
"""
