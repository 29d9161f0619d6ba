from salactl.runtime.ops.gla.reference import gla_chunked, gla_recurrent

__all__ = ["gla_chunked", "gla_recurrent"]
