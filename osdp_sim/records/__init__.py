from osdp_sim.records.record import (FORMAT, STATUSES, VERSION, Record, build_record, load_record,
                                     load_records, plan_hash, predict, predicted_from_estimate, record_from_dict,
                                     record_name, save_record, save_record_as, time_stats)

__all__ = ["FORMAT", "STATUSES", "VERSION", "Record", "build_record", "load_record", "load_records",
           "plan_hash", "predict", "predicted_from_estimate", "record_from_dict", "record_name", "save_record",
           "save_record_as", "time_stats"]
