"""salactl: quantize, run, profile and benchmark MiniCPM-SALA-class hybrid LLMs."""

__version__ = "0.1.0"
