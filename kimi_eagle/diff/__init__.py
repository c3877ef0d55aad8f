"""Stage 3: engine IDs against reconstructed IDs by bytes (alignment, classification, billing, reports, inspector, simulation)."""
