"""Stage 3: engine IDs against reconstructed IDs by bytes (byte diff, alignment, classification, billing, reports, inspector, simulation)."""
