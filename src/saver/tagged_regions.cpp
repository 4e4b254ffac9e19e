// TaggedRegions: which regions are backed up.
#include "src/saver/tagged_regions.h"

#include <algorithm>

namespace memsim {

bool TaggedRegions::backup_on_pause(const Alloc& a) const {
  return config_.cpu_backup_all ||
         std::find(config_.cpu_backup_tags.begin(), config_.cpu_backup_tags.end(), a.tag) !=
             config_.cpu_backup_tags.end();
}

}  // namespace memsim
