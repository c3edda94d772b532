"""From the ensemble to answers: fits, figures, the HTML report."""
