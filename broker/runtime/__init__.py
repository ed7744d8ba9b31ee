"""What every Laneway process shares at run time, below the loops and above the wire contract."""
